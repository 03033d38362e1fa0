"""The numpy CPU reference: layer ops (ops.py) and the full forward (forward.py, ReferenceBackend)."""

from minfer.reference.forward import ReferenceBackend

__all__ = ["ReferenceBackend"]
