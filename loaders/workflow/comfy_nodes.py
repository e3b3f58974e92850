"""What the API format does not say: each node class's input and output types, read from a
running ComfyUI's ``NODE_CLASS_MAPPINGS`` (V1 and V3 classes both answer ``INPUT_TYPES`` and
``RETURN_TYPES``). Takes the mappings as an argument: nothing here imports ComfyUI."""
from __future__ import annotations


def node_io_from_mappings(mappings) -> callable:
    """``class_type -> (input types, output types)``, None for an unknown class or one whose
    schema cannot be read."""
    def node_io(class_type: str):
        cls = mappings.get(class_type)
        if cls is None:
            return None
        try:
            spec = cls.INPUT_TYPES()
            outputs = [str(t) for t in (cls.RETURN_TYPES or ())]
        except Exception:   # a third-party schema that fails to build: treat the class as unknown
            return None
        inputs = [t if isinstance(t, str) else "COMBO" for section in ("required", "optional")
                  for t in (v[0] for v in (spec.get(section) or {}).values())]
        return inputs, outputs
    return node_io
