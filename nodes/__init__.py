"""V3 node classes (thin: they call into ``loaders/``) and the pack's one ``comfy_entrypoint``."""
from comfy_api.latest import ComfyExtension, io

from . import node_list


class ShardDiTExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return node_list.all_nodes()


async def comfy_entrypoint() -> ShardDiTExtension:
    from ..loaders.comfy.remote.host_workers import cluster_settings_note

    cluster_settings_note()  # a refused cluster setting, or the former lobby's settings, said once at start
    return ShardDiTExtension()
