"""Let ``rmsref.gradcheck`` / ``rmsref.validate`` be called even when the *module* is bound.

``rmsref.gradcheck`` is documented as a function, and ``rmsref/gradcheck.py`` is its module. After
``import rmsref.gradcheck`` (or ``from rmsref.gradcheck import ...``) Python binds the module on the
package, hiding the function. Making the module callable keeps ``rmsref.gradcheck(...)`` working
whichever of the two is bound.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any


def make_module_callable(module_name: str, func: Callable[..., Any]) -> None:
    """Make ``sys.modules[module_name](...)`` call ``func(...)``."""
    module = sys.modules[module_name]

    class _CallableModule(types.ModuleType):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return func(*args, **kwargs)

    module.__class__ = _CallableModule
