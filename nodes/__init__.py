"""V3 node classes (thin: they call into ``loaders/``) and the pack's one ``comfy_entrypoint``."""
from comfy_api.latest import ComfyExtension, io

from . import node_list


class ShardDiTExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return node_list.all_nodes()


async def comfy_entrypoint() -> ShardDiTExtension:
    from ..loaders.comfy.distributed import start_lobby_if_configured

    start_lobby_if_configured()  # workers may join from now on (only when SHARDDIT_DIST_ADDR is set)
    return ShardDiTExtension()
