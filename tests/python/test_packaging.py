"""pyproject.toml ships every package of commlib (a non-editable install would miss one otherwise)."""
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_commlib_package_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "commlib").rglob("__init__.py")}
    assert found == listed
