"""Workflow files as ComfyUI saves them: the shard transform (``shard``: a Shard node after every
diffusion-model source, and its inverse), its layout rules (``layout``) and the installed core
templates it is applied to (``templates``). Plain JSON work: nothing here imports ComfyUI."""
