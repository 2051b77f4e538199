"""The README's and the docs' promises that code can check: the first program runs and prints
what it says (in one process and on 2 MPI ranks), the Quickstart is two self-contained commands,
every example is listed and every listed one exists, every environment variable the code reads
is in the table (or named as private), the README stays a first visit's page and its links
lead somewhere, and the documentation builds strictly (a broken link, a missing page or anchor,
or an API entry that does not import fails the build)."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
PACKAGES = ("popxl_dist", "addons", "launch", "popdist", "popart")


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def page(name: str) -> str:
    return (DOCS / name).read_text()


def code_blocks(text: str, lang: str):
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def first_program(tmp_path: Path) -> Path:
    blocks = [b for b in code_blocks(section(README, "Your first PopXL program"), "python")
              if b.startswith("# first.py\n")]
    assert len(blocks) == 1
    assert blocks[0] in page("first-program.md")          # the docs show the same program
    path = tmp_path / "first.py"
    path.write_text(blocks[0])
    return path


def expected_output(program: Path) -> str:
    comment = program.read_text().rstrip().splitlines()[-1].split("# ", 1)[1]
    return " ".join(comment.split())


def test_first_program_prints_what_the_readme_says(tmp_path):
    program = first_program(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POPXL_")}
    out = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert " ".join(out.stdout.split()) == expected_output(program) == \
        "[[11. 22. 33.] [11. 22. 33.]]"


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="needs the mpi extra")
def test_first_program_on_two_mpi_ranks_as_the_readme_runs_it(tmp_path):
    program = first_program(tmp_path)
    block = code_blocks(section(README, "Your first PopXL program"), "bash")[0]
    command = next(line.split("#")[0].split() for line in block.splitlines()
                   if "--backend mpi" in line)
    assert command == ["popxl-run", "--backend", "mpi", "--workers", "2", "first.py"]
    popxl_run = Path(sys.executable).parent / "popxl-run"
    out = subprocess.run([str(popxl_run)] + command[1:], capture_output=True, text=True,
                         cwd=tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr
    assert " ".join(out.stdout.split()) == expected_output(program)


def test_quickstart_is_two_commands_each_setting_itself_up():
    commands = code_blocks(section(README, "Quickstart"), "bash")
    assert len(commands) == 2
    for command in commands:
        assert command.count("\n") == 1 and command.startswith("python3 -m venv .venv && ")
        assert 'pip install -e ".[' in command


def test_the_readme_is_a_first_visits_page_and_its_links_lead_somewhere():
    assert len(README.splitlines()) < 300
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target


def test_every_example_is_listed_and_every_listed_example_exists():
    listed = set(re.findall(r"^\| `(\w+\.py)` \|", page("examples.md"), re.M))
    present = {p.name for p in (ROOT / "examples").glob("*.py") if not p.name.startswith("_")}
    assert listed == present


def test_every_environment_variable_the_code_reads_is_documented():
    names = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            names |= set(re.findall(r"[\"']((?:POPXL|MODEL|POPLAR)_[A-Z0-9_]+)[\"']",
                                    path.read_text()))
    names.discard("POPXL_RUN_PREFIX")      # a constant's name in an `__all__`, not a variable
    text = page("environment.md")
    undocumented = sorted(n for n in names if f"`{n}`" not in text)
    assert undocumented == []


@pytest.mark.skipif(importlib.util.find_spec("sphinx") is None or
                    importlib.util.find_spec("myst_parser") is None,
                    reason="needs the docs extra (sphinx, myst-parser, furo)")
def test_the_documentation_builds_strictly(tmp_path):
    res = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b",
                          "html", str(DOCS), str(tmp_path / "site")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, (res.stdout + res.stderr)[-5000:]
    assert (tmp_path / "site" / "debugging.html").exists()
