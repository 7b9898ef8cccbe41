"""The README's Python example runs as written (so the front page cannot rot)."""
import pathlib
import re
import runpy

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def readme_python_blocks():
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_readme_has_one_python_example():
    blocks = readme_python_blocks()
    assert len(blocks) == 1, f"expected one ```python block in README.md, found {len(blocks)}"
    for name in ("torchops.nn.BatchNorm2d", "torchops.nn.CudnnLSTM", "torch.jit.script", "torch.export",
                 "torchops.onnx.export"):
        assert name in blocks[0], f"the README example no longer uses {name}"


def test_readme_example_runs(tmp_path, capsys):
    for module in ("onnx", "onnxscript", "onnxruntime"):  # the example's ONNX export (requirements-dev.txt)
        pytest.importorskip(module)
    # Run from a file: torch.jit.script reads the module's source with inspect.
    script = tmp_path / "readme_example.py"
    script.write_text(readme_python_blocks()[0])
    runpy.run_path(str(script), run_name="__main__")
    assert "loss after 5 steps" in capsys.readouterr().out
