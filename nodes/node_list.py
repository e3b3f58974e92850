"""Every node the pack registers. Each node module exposes ``NODES``; add new modules here."""


def all_nodes() -> list:
    from . import debug_nodes, loader_nodes, sampling_nodes, vae_nodes

    nodes = []
    for module in (loader_nodes, sampling_nodes, vae_nodes, debug_nodes):
        nodes.extend(module.NODES)
    return nodes
