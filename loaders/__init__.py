"""The pack's ComfyUI side, by concern: ``comfy/`` (adapters used by the nodes, in rooms of their
own), ``plan/`` (the dry-run planner: will this fit?), ``workflow/`` (workflow files: the shard
transform, its routes and the template category), ``cli/`` (the command line and self-test), and
``comfyui_import`` (finds and imports ComfyUI outside a server: the CLI and the tests). Imports
point one way: cli -> plan -> comfy -> parallel; cli -> workflow (ComfyUI-free, but for its routes)."""
