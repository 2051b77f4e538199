"""`popxl.Module`: a base class whose `build` becomes a graph through `Ir.create_graph`."""

__all__ = ["Module"]


class Module:
    """Override `build`; `ir.create_graph(module, ...)` builds it into a subgraph."""

    def __call__(self, *args, **kwargs):
        return self.build(*args, **kwargs)

    def build(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__}.build must be overridden")
