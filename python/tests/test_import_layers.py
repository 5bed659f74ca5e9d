"""scripts/import-cycles.py: the layer check finds an import that runs up the layers, an
unplaced module and a circle, on small crates written here (make test runs it on the real ones)."""
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "import-cycles.py"


def crate(tmp_path: Path, files: dict, layers: str | None) -> Path:
    for rel, text in files.items():
        p = tmp_path / "src" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    if layers is not None:
        (tmp_path / "layers.toml").write_text(layers)
    return tmp_path


def check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True)


LIB = "mod top;\nmod low;\n"
LAYERS = '[layers]\n"" = [["top"], ["low"]]\n'


def test_a_downward_import_passes(tmp_path):
    r = check(crate(tmp_path, {"lib.rs": LIB, "top.rs": "use crate::low::X;\n", "low.rs": "pub struct X;\n"}, LAYERS))
    assert r.returncode == 0, r.stdout
    assert "no upward arrows" in r.stdout


def test_an_upward_import_fails_and_names_both_files(tmp_path):
    r = check(crate(tmp_path, {"lib.rs": LIB, "top.rs": "pub struct T;\n", "low.rs": "use crate::top::T;\n"}, LAYERS))
    assert r.returncode == 1
    assert "upward arrow" in r.stdout and "low.rs" in r.stdout and "top.rs" in r.stdout


def test_a_module_without_a_layer_fails(tmp_path):
    files = {"lib.rs": LIB + "mod extra;\n", "top.rs": "", "low.rs": "", "extra.rs": ""}
    r = check(crate(tmp_path, files, LAYERS))
    assert r.returncode == 1
    assert "extra has no layer" in r.stdout


def test_nested_layers_are_checked_inside_a_folder(tmp_path):
    files = {
        "lib.rs": "mod top;\nmod low;\n",
        "top.rs": "",
        "low/mod.rs": "mod a;\nmod b;\n",
        "low/a.rs": "pub struct A;\n",
        "low/b.rs": "use super::a::A;\n",
    }
    layers = LAYERS + '"low" = [["b"], ["a"]]\n'
    assert check(crate(tmp_path, files, layers)).returncode == 0
    reversed_layers = LAYERS + '"low" = [["a"], ["b"]]\n'
    r = check(crate(tmp_path, files, reversed_layers))
    assert r.returncode == 1 and "upward arrow" in r.stdout


def test_a_circle_fails_without_layers(tmp_path):
    files = {"lib.rs": LIB, "top.rs": "use crate::low::X;\npub struct T;\n", "low.rs": "use crate::top::T;\npub struct X;\n"}
    r = check(crate(tmp_path, files, None))
    assert r.returncode == 1 and "import circle" in r.stdout
