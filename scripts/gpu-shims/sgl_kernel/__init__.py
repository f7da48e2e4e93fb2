"""An import stand-in for ``sgl_kernel``, used by scripts/gpu-check.sh only.

SGLang's memory-pool modules import ``sgl_kernel`` (its CUDA kernels) at module level when
torch sees CUDA. Its wheels are hundreds of MB, past what travels to the GPU host, and the
direct-linker tests never call those kernels: PeerCache's linker moves pages with torch's own
copies. So this package lets the imports succeed, and any kernel actually called raises
``NotImplementedError`` naming it: a test that reaches one fails and says which. It is put
last on ``PYTHONPATH``, so a real ``sgl_kernel`` wins wherever one is installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import NoReturn, Optional, Sequence, Tuple

STAND_IN = True


class _Missing:
    """A name of the stand-in: calling it raises ``NotImplementedError`` naming it; its
    attributes are stand-ins too (SGLang reads ``scalar_types.uint4b8`` at import), and a class
    may name it as a base (it then derives from ``object`` alone)."""

    __slots__ = ("_qualname",)

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        raise NotImplementedError(f"{self._qualname}: sgl_kernel is not installed here (gpu-check's import stand-in)")

    def __getattr__(self, name: str) -> "_Missing":
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self._qualname}.{name}")

    def __mro_entries__(self, bases: Tuple[object, ...]) -> Tuple[type, ...]:
        return (object,)

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in {self._qualname}>"


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> _Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes every ``sgl_kernel.<sub>`` a stand-in module too."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Optional[types.ModuleType] = None
                  ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


sys.meta_path.append(_Finder())
sys.modules[__name__].__class__ = _StandIn
