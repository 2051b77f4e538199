"""Grad rules: the remote buffer ops and RemoteCodeLoad have none (as upstream)."""
from __future__ import annotations

from ..grad_registry import no_grad

__all__: list = []   # registrations only

no_grad("RemoteLoad", "RemoteLoadInplace", "RemoteStore", "RemoteCodeLoad")
