"""Venvs built over another venv by symbolic links, nothing copied (docs/development.md, "Install
and test"): a one-server venv over `make install`'s venv, a server release's venv over the
one-server venv (scripts/release_env.sh).

    python scripts/venv_links.py over BASE NEW --follow REQ... [--as-is NAME...]
        A new venv NEW holding, of BASE's installed distributions, those that `pip install REQ...`
        (dependencies followed) plus `pip install --no-deps NAME...` would have installed, at
        BASE's versions: each one's files linked in, its console scripts written for NEW's
        interpreter. A REQ of the form `-r FILE` reads a requirements file. Run with BASE's
        interpreter.
    python scripts/venv_links.py link BASE_SITE SITE [--drop] NAME...
        Link every entry of BASE_SITE into SITE but those of the distributions NAME... (each one's
        top-level packages, modules and metadata, whole); with --drop, remove the links of those
        distributions from SITE instead. Run with the interpreter of BASE_SITE's venv.

A distribution's files are left out or linked whole, every top-level entry it holds: FlashInfer
0.7.2 ships a `b12x` package beside `flashinfer`, and a release that replaces FlashInfer must
not see it. An entry held by two distributions, one replaced and one not, is refused.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon

# what a venv holds from its creation (`python -m venv`): linked in whatever is asked
VENV_OWN = {"pip", "setuptools", "wheel"}


def distributions(site: Path) -> dict[str, md.Distribution]:
    return {canon(d.metadata["Name"]): d for d in md.distributions(path=[str(site)])}


def tops(dist: md.Distribution) -> set[str]:
    """The top-level entries of site-packages that `dist` holds (its .dist-info among them)."""
    held = {Path(str(f)).parts[0] for f in dist.files or []} - {"..", "__pycache__"}
    return held | {Path(dist._path).name}  # type: ignore[attr-defined]


def owners(site: Path) -> dict[str, set[str]]:
    """Each top-level entry of `site` -> the distributions holding it."""
    held: dict[str, set[str]] = {}
    for name, dist in distributions(site).items():
        for top in tops(dist):
            held.setdefault(top, set()).add(name)
    return held


def link(base: Path, site: Path, names: set[str], drop: bool = False) -> None:
    """Link every entry of `base` into `site` but those of the distributions `names` (with
    `drop`: remove their links from `site`)."""
    held = owners(base)
    skipped = {top for top, dists in held.items() if dists & names}
    shared = {top for top in skipped if held[top] - names and not top.endswith(".dist-info")}
    if shared:
        sys.exit(f"venv_links: {sorted(shared)} of {sorted(names)} are shared with other "
                 "packages of the venv; replacing them is not supported here")  # fmt: skip
    for entry in base.iterdir():
        target = site / entry.name
        if entry.name in skipped:
            if drop and target.is_symlink():
                target.unlink()
        elif not drop and entry.name != "__pycache__" and not target.exists():
            os.symlink(entry, target)


def requirements(args: list[str]) -> list[Requirement]:
    """REQ arguments and `-r FILE` (its lines, `-r` nested; comments and options skipped)."""
    out: list[Requirement] = []
    it = iter(args)
    for arg in it:
        if arg == "-r":
            path = Path(next(it))
            lines = [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines()]
            for line in filter(None, lines):
                if line.startswith("-r "):
                    out += requirements(["-r", str(path.parent / line[3:].strip())])
                elif not line.startswith("-"):
                    out.append(Requirement(line))
        else:
            out.append(Requirement(arg))
    return out


def closure(dists: dict[str, md.Distribution], follow: list[Requirement], as_is: set[str]):
    """The distributions `pip install` of `follow` (dependencies followed, extras and markers
    as pip reads them) and of `as_is` (--no-deps) installs, as installed in `dists`."""
    extras: dict[str, set[str]] = {}
    todo = [(canon(r.name), set(r.extras)) for r in follow]
    missing: list[str] = []
    while todo:
        name, wanted = todo.pop()
        if name not in dists:
            missing.append(name)
            continue
        new = (wanted | {""}) - extras.get(name, set())
        if name in extras and not new:
            continue
        extras.setdefault(name, set()).update(new)
        for line in dists[name].requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in new):
                todo.append((canon(req.name), set(req.extras)))
    absent = [n for n in as_is if n not in dists]
    if missing or absent:
        sys.exit(f"venv_links: the base venv lacks {sorted(set(missing + absent))}")
    return set(extras) | as_is


def console_scripts(dists: list[md.Distribution], bin_dir: Path, python: Path) -> None:
    """Each distribution's console scripts, for `python` (the base's name its interpreter)."""
    for dist in dists:
        for ep in dist.entry_points.select(group="console_scripts"):
            module, _, attr = ep.value.partition(":")
            attr = attr.strip()
            run = (
                f"from {module} import {attr.split('.')[0]}\nsys.exit({attr}())"
                if attr
                else f"import runpy\nrunpy.run_module({module!r}, run_name='__main__')"
            )
            script = bin_dir / ep.name
            script.write_text(f"#!{python}\nimport sys\n{run}\n")
            script.chmod(0o755)


def over(base_venv: Path, new_venv: Path, follow: list[Requirement], as_is: set[str]) -> None:
    import sysconfig

    base = Path(sysconfig.get_paths()["purelib"])
    if not base.is_relative_to(base_venv.resolve()) and not base.is_relative_to(base_venv):
        sys.exit(f"venv_links: run with {base_venv}/bin/python (this is {sys.executable})")
    dists = distributions(base)
    kept = closure(dists, follow, as_is | (VENV_OWN & set(dists)))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(new_venv)], check=True)
    python = new_venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )  # fmt: skip
    link(base, site, set(dists) - kept)
    console_scripts([dists[n] for n in sorted(kept)], new_venv / "bin", python.absolute())


def main(argv: list[str]) -> None:
    usage = __doc__.split("\n\n")[1]
    if argv[:1] == ["over"] and len(argv) >= 4 and argv[3] == "--follow":
        rest = argv[4:]
        cut = rest.index("--as-is") if "--as-is" in rest else len(rest)
        as_is = {canon(Requirement(n).name) for n in rest[cut + 1 :]}
        over(Path(argv[1]), Path(argv[2]), requirements(rest[:cut]), as_is)
    elif argv[:1] == ["link"] and len(argv) >= 3:
        drop = argv[3:4] == ["--drop"]
        link(Path(argv[1]), Path(argv[2]), {canon(n) for n in argv[3 + drop :]}, drop)
    else:
        sys.exit(f"usage:\n{usage}")


if __name__ == "__main__":
    main(sys.argv[1:])
