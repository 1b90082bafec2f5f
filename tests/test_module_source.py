"""fslab.core.module_source reads a plugin module's top-level names without running it, so that a misspelt
lazy target is refused before a run exists. A name it misses would refuse a target that works: every name a
module has once run must be among those it reads, or it must say it cannot tell (None)."""

import importlib
import sys
import textwrap

import pytest

from fslab.core.module_source import defined_names

STATIC = {
    "plain": "import os\nfrom math import pi as PI\nX = 1\nclass Net: pass\ndef build(): pass\n",
    "blocks": textwrap.dedent("""
        try:
            import json
        except ImportError:
            json = None
        if True:
            A, (B, C) = 1, (2, 3)
        else:
            D = 4
        for I in range(2):
            pass
        with open(__file__) as HANDLE:
            pass
        if (W := 5):
            pass
        def declare():
            global G
            G = 1
        declare()
        import os.path
        """),
    "match": "match {'a': 1, 'b': 2}:\n    case {'a': 1, **REST}:\n        pass\n",
}
DYNAMIC = {
    "globals": "globals()['Made'] = 1\n",
    "locals": "locals()['Made'] = 1\n",
    "vars": "vars()['Made'] = 1\n",
    "exec": "exec('Made = 1')\n",
    "star": "from math import *\n",
    "getattr": "def __getattr__(name):\n    return name\n",
    "sys_modules": "import sys\nsetattr(sys.modules[__name__], 'Made', 1)\n",
}


def _module(tmp_path, monkeypatch, name, source):
    (tmp_path / f"fslab_ms_{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"fslab_ms_{name}"


@pytest.mark.parametrize("name", sorted(STATIC))
def test_every_name_a_module_has_once_run_is_read_from_its_source(tmp_path, monkeypatch, name):
    module = _module(tmp_path, monkeypatch, name, STATIC[name])
    read = defined_names(module)
    assert module not in sys.modules  # read, not run
    ran = set(vars(importlib.import_module(module)))
    sys.modules.pop(module)
    assert read is not None and ran <= read, sorted(ran - (read or set()))
    assert "Nowhere" not in read


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_a_module_that_may_make_names_its_source_does_not_spell_is_not_judged(tmp_path, monkeypatch, name):
    module = _module(tmp_path, monkeypatch, name, DYNAMIC[name])
    assert defined_names(module) is None
    assert module not in sys.modules
