"""The pack's ComfyUI side, by concern: ``comfy/`` (adapters used by the nodes), ``simulator/``
(the plan simulator), ``workflow/`` (workflow files: the shard transform, its routes and the
template category), ``cli/`` (the command line and self-test), and ``comfyui_import`` (finds and
imports ComfyUI outside a server: the CLI and the tests). Imports point one way:
cli -> simulator -> comfy -> parallel; cli -> workflow (ComfyUI-free, but for its routes)."""
