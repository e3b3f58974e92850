"""The pack's ComfyUI side, by concern: ``comfy/`` (adapters used by the nodes), ``simulator/``
(the plan simulator), ``cli/`` (the command line and self-test), and ``comfyui_import`` (finds and
imports ComfyUI outside a server: the CLI and the tests). Imports point one way:
cli -> simulator -> comfy -> parallel."""
