"""Documentation and terminal behaviour of the command line.

Every command and subcommand has help text with an "Example", and ``--help`` works for each;
progress display goes to a terminal on stderr, never into ``--json`` output.
"""

from __future__ import annotations

import json
import re
import os
import pty
import select
import subprocess
import sys
import threading
from pathlib import Path

import click
import pytest

from syncpack.cli import cli

from conftest import run


def walk(cmd: click.Command, path: tuple[str, ...] = ()):
    """(path, command) for the group and every command below it, recursively."""
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.commands):
            yield from walk(cmd.commands[name], path + (name,))


COMMANDS = list(walk(cli))
IDS = [" ".join(p) or "syncpack" for p, _ in COMMANDS]


def test_the_walk_finds_nested_commands():
    paths = {p for p, _ in COMMANDS}
    for p in [(), ("import",), ("export",), ("batch",), ("mkreplica", "export"),
              ("mkreplica", "import"), ("conflicts", "resolve"), ("collection", "create")]:
        assert p in paths, p


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=IDS)
def test_every_command_has_help_with_an_example(path, cmd):
    name = " ".join(("syncpack",) + path)
    text = cmd.help or ""
    assert text.strip(), f"{name} has no help text (give the command a docstring)"
    assert "Example" in text, f"{name}'s help has no 'Example:' block"
    assert cmd.get_short_help_str().strip(), f"{name} has no short help"


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=IDS)
def test_help_exits_zero(path, cmd):
    r = run(*path, "--help")
    assert r.code == 0, r
    assert r.out.startswith("Usage: "), r
    assert "Example" in r.out
    assert r.err == ""


def test_short_help_flag_and_no_command():
    assert run("-h").code == 0
    r = run()
    assert r.code in (0, 2) and "Usage:" in r.out + r.err


# --- progress display -------------------------------------------------------------------------

def _run_with_tty_stderr(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """Run the real program with stderr on a pseudo-terminal (as a person at a terminal sees
    it) and stdout on a pipe (as a script reading --json sees it)."""
    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS="100", TERM="xterm")
    p = subprocess.Popen([sys.executable, "-m", "syncpack", *args], cwd=cwd, env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:  # keep the pty from filling up while the program writes
        while True:
            r, _, _ = select.select([master], [], [], 30)
            if not r:
                return
            try:
                b = os.read(master, 65536)
            except OSError:  # EIO: the program closed its end
                return
            if not b:
                return
            chunks.append(b)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    out, _ = p.communicate(timeout=120)
    t.join(timeout=30)
    os.close(master)
    return p.returncode, out.decode(), b"".join(chunks).decode(errors="replace")


@pytest.fixture
def two_sites(family):
    family.init("boston")
    family.add("sanfran", via="boston")
    with family.open("boston") as s, s.transaction() as tx:
        for i in range(200):
            tx.put("parts", f"p-{i}", {"qty": i})
    return family


def test_progress_shows_on_a_terminal_but_never_in_json(two_sites, tmp_path):
    fam = two_sites
    boston, sanfran = str(fam.path("boston")), str(fam.path("sanfran"))
    usb = tmp_path / "usb"

    # Human mode on a terminal: a progress bar on stderr, nothing of it on stdout.
    code, out, err = _run_with_tty_stderr(
        ["--site", boston, "export", "--to", "sanfran", "--create-out", "--out",
         str(usb / "a")], tmp_path)
    assert code == 0, err
    assert "\rexport: " in err and "/200 [" in err, err      # the bar, with its total
    assert "export:" not in out and "\r" not in out

    # --json on the same terminal: stdout is exactly one JSON document, no progress anywhere.
    code, out, err = _run_with_tty_stderr(
        ["--json", "--site", sanfran, "import", str(usb / "a")], tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert out.strip() == json.dumps(doc, indent=2)
    assert doc["ops_applied"] > 0 and len(doc["applied"]) == 1
    assert "import: " not in err and "\r" not in err, err

    with fam.open("boston") as s, s.transaction() as tx:
        tx.put("parts", "p-new", {"qty": 1})
    code, out, err = _run_with_tty_stderr(
        ["--json", "--site", boston, "export", "--to", "sanfran", "--create-out", "--out",
         str(usb / "b")],
        tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert out.strip() == json.dumps(doc, indent=2)
    assert [p["to"] for p in doc["packets"]] == ["sanfran"]
    assert "export: " not in err and "\r" not in err, err

    # A batch round: progress on the terminal in human mode, none with --json.
    cfg = tmp_path / "sanfran.toml"
    inbox = usb / "b"
    cfg.write_text(f'site = "{sanfran}"\n[[import]]\npath = "{inbox}"\n')
    code, out, err = _run_with_tty_stderr(["--json", "batch", str(cfg)], tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert out.strip() == json.dumps(doc, indent=2)
    assert doc["counts"]["applied"] == 1 and err == "", err


def test_json_output_is_only_the_document_in_process(two_sites, tmp_path):
    """The same through the in-process runner (stderr not a terminal): stdout parses whole."""
    fam = two_sites
    r = run("export", "--to", "sanfran", "--create-out", "--out", tmp_path / "usb",
            site=fam.path("boston"), json_mode=True)
    assert r.code == 0, r
    assert json.loads(r.out)["packets"]
    r = run("import", tmp_path / "usb", site=fam.path("sanfran"), json_mode=True)
    assert r.code == 0, r
    assert json.loads(r.out)["ops_applied"] == 200
    assert r.err == ""


# --- the documentation in docs/ ---------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "commands.md"
GLOBAL_SECTION = "Global options"


def reference_sections() -> dict[str, str]:
    """Heading -> its text up to the next heading of any level.  Commands are the headings
    written as code (### `mkreplica export`); others keep their title (Global options)."""
    sections: dict[str, str] = {}
    name = None
    for line in REFERENCE.read_text().splitlines():
        m = re.match(r"^#{1,4} (.+?)\s*$", line)
        if m:
            title = m[1]
            code = re.fullmatch(r"`([^`]+)`", title)
            name = code[1] if code else title
            assert name not in sections, f"docs/commands.md has two sections {name!r}"
            sections[name] = ""
        elif name is not None:
            sections[name] += line + "\n"
    return sections


def mentions_option(text: str, opt: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text) is not None


def test_reference_documents_every_command_and_option():
    sections = reference_sections()
    missing = []
    for path, cmd in COMMANDS:
        name = " ".join(path) or GLOBAL_SECTION
        text = sections.get(name)
        if text is None:
            missing.append(f"no section for 'syncpack {name}' in docs/commands.md")
            continue
        for p in cmd.params:
            if isinstance(p, click.Option):
                for opt in p.opts + p.secondary_opts:
                    if not mentions_option(text, opt):
                        missing.append(f"{opt} of {name!r} is not in its section")
    for opt in cli.get_help_option(click.Context(cli)).opts:
        if not mentions_option(sections[GLOBAL_SECTION], opt):
            missing.append(f"{opt} is not in the global options")
    assert not missing, "\n".join(missing)


def test_reference_names_only_commands_that_exist():
    known = {" ".join(p) for p, _ in COMMANDS if p}
    commands = [n for n in reference_sections() if re.fullmatch(r"[a-z][a-z -]*", n)]
    assert len(commands) >= len(known)
    assert [n for n in commands if n not in known] == []


def invoked_command(words: list[str]) -> tuple[str, ...] | None:
    """The command path a 'syncpack ...' line invokes, skipping global options."""
    takes_value = {"--site"}
    i = 0
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in takes_value else 1
    if i >= len(words) or not re.fullmatch(r"[a-z][a-z-]*", words[i]):
        return None     # a placeholder such as COMMAND
    path = (words[i],)
    cmd = cli.commands.get(words[i])
    if isinstance(cmd, click.Group) and not cmd.invoke_without_command \
            and i + 1 < len(words) and re.fullmatch(r"[a-z][a-z-]*", words[i + 1]):
        path += (words[i + 1],)
    return path


def doc_files() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def code_in(text: str) -> list[str]:
    """The lines of fenced code blocks and the inline code spans of a Markdown text."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            out.append(line)
        else:
            out += re.findall(r"`([^`]+)`", line)
    return out


def test_docs_name_only_commands_that_exist():
    known = {p for p, _ in COMMANDS}
    bad = []
    for f in doc_files():
        for code in code_in(f.read_text()):
            m = re.search(r"(?:^|[\s/(])syncpack((?: +[^\s|;&#)]+)+)", code)
            if m is None:
                continue
            words = m[1].split()
            path = invoked_command(words)
            if path is not None and path not in known:
                bad.append(f"{f.relative_to(ROOT)}: 'syncpack {m[1].strip()}' names no command")
    assert not bad, "\n".join(bad)


def anchors(md: Path) -> set[str]:
    """The anchors a Markdown renderer (GitHub's rule) gives the headings of a file."""
    return {re.sub(r"[^\w\- ]", "", m.lower()).replace(" ", "-")
            for m in re.findall(r"^#{1,6} +(.+?) *$", md.read_text(), re.M)}


def test_links_resolve_inside_the_repository():
    bad = []
    for f in doc_files():
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", f.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue            # a web address or an anchor in the same page
            file_part, _, anchor = target.partition("#")
            dest = (f.parent / file_part).resolve()
            if ROOT not in dest.parents or not dest.exists():
                bad.append(f"{f.relative_to(ROOT)}: link to {target} does not resolve inside "
                           f"the repository")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{f.relative_to(ROOT)}: {target}: no heading #{anchor} there")
    assert not bad, "\n".join(bad)
    assert (ROOT / "docs" / "README.md").exists()


def test_docs_name_only_source_files_that_exist():
    """The specs and guides name the module that implements what they describe: after the
    package was laid out in subpackages, formats/ still named nine modules by their old
    paths (syncpack/oplog.py, syncpack/blocks.py, ...)."""
    bad = []
    for f in [*doc_files(), *(ROOT / "formats").glob("*.md"), *(ROOT / "tools").glob("*.py")]:
        for path in re.findall(r"(?<![\w/])syncpack/[\w/]+\.py", f.read_text()):
            if not (ROOT / path).exists():
                bad.append(f"{f.relative_to(ROOT)}: {path}")
    assert not bad, "\n".join(sorted(set(bad)))


def repository_files() -> list[Path]:
    """Files git would track (committed or not, ignored ones left out); without git (an
    unpacked source archive), every file outside hidden and build directories."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                              "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        return [ROOT / p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {"__pycache__", "build", "spark-warehouse", "metastore_db"}
        return [p for p in ROOT.rglob("*") if p.is_file() and not any(
            part.startswith(".") or part in skip or part.endswith(".egg-info")
            for part in p.relative_to(ROOT).parts[:-1])]


# Built from pieces so this file does not match itself.
BRIEF = re.compile("|".join([re.escape("../" + "shared"), r"\bDESIGN" + r"(?:\.md|\s*§)",
                             r"\bCLI" + r"\.md"]))


def test_nothing_points_outside_the_repository_to_the_brief():
    bad = []
    for f in repository_files():
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if BRIEF.search(line):
                bad.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "the repository must document itself:\n" + "\n".join(bad)


# --- the JSON contract: every field a command prints is in its section -------------------------

# Maps keyed by site, origin or setting names: their keys are data, their values are not.
KEYED_BY_NAME = {"peers", "vector", "ranges", "waiting_for", "sent", "acked", "floors",
                 "origins", "ops_held"}
USER_DATA = {"value", "visible"}


def json_fields(doc, out: set[str], keyed: bool = False) -> set[str]:
    if isinstance(doc, dict):
        for k, v in doc.items():
            if not keyed:
                out.add(k)
            if k in USER_DATA:
                continue
            json_fields(v, out, keyed=k in KEYED_BY_NAME and not keyed)
    elif isinstance(doc, list):
        for v in doc:
            json_fields(v, out)
    return out


@pytest.fixture(scope="module")
def json_documents(tmp_path_factory) -> dict[str, list]:
    """Every command with --json on a real family, failures included."""
    root = tmp_path_factory.mktemp("contract")
    docs: dict[str, list] = {}

    def j(cmd: str, *args, site=None, code=0):
        r = run(*cmd.split(), *args, site=site, json_mode=True)
        assert r.code == code, (cmd, r)
        docs.setdefault(cmd, []).append(r.json)
        return r.json

    b, s, g = root / "boston", root / "sanfran", root / "bangalore"
    usb = root / "usb"
    j("init", b, "--family", "parts", "--site", "boston")
    for d, n in ((s, "sanfran"), (g, "bangalore")):
        pub = j("keygen", d, "--site", n)["public_key"]
        j("mkreplica export", "--site", n, "--pubkey", pub, "--out", usb / n, "--create-out", site=b)
        j("mkreplica import", usb / n, site=d)
    j("keyinfo", site=b)
    j("put", "parts", "p1", '{"qty": 1}', site=b)
    j("put", "parts", "p1", '{"qty": 9}', site=s)          # concurrent: a conflict
    j("delete", "parts", "p0", site=b)
    j("get", "parts", "p1", site=b)
    lines = root / "load.jsonl"
    lines.write_text('{"collection": "parts", "key": "p2", "value": 2}\n'
                     '{"collection": "parts", "key": "p3", "delete": true}\n')
    j("load", lines, site=b)
    j("ls", site=b)
    import sqlite3
    appdb = root / "shop.db"
    con = sqlite3.connect(appdb)
    con.execute("CREATE TABLE orders(id TEXT PRIMARY KEY, qty INTEGER)")
    con.execute("CREATE TABLE seq(n INTEGER PRIMARY KEY)")
    con.execute("INSERT INTO orders VALUES ('o1', 1)")
    con.commit()
    j("attach", appdb, "--table", "orders", "--table", "seq", site=b)
    con.execute("INSERT INTO orders VALUES ('o2', 2)")
    con.commit()
    con.close()
    j("attached", site=b)
    j("capture", site=b)
    j("detach", appdb, "--table", "seq", site=b)
    j("collection create", "tools", "--policy", "priority", site=b)
    j("collection ls", site=b)
    j("priority", "boston", "5", site=b)
    j("require-sealing", "off", site=b)
    j("export", "--all", "--out", usb / "1", "--create-out", site=b)
    j("export", "--to", "boston", "--out", usb / "2", "--create-out", site=s)
    j("lspacket", usb / "1", site=s)
    j("import", usb / "1", site=s)
    j("import", usb / "2", site=b)
    # A lost packet makes the next one park; a damaged one is rejected.
    j("put", "parts", "p4", "4", site=b)
    j("export", "--to", "sanfran", "--out", usb / "lost", "--create-out", site=b)
    j("put", "parts", "p5", "5", site=b)
    second = j("export", "--to", "sanfran", "--out", usb / "4", "--create-out",
               site=b)["packets"][0]["path"]
    damaged = root / "damaged.spk"
    damaged.write_bytes(Path(second).read_bytes()[:-8])
    j("lspacket", damaged, code=1)
    j("import", usb / "4", damaged, site=s, code=1)
    j("status", site=s)
    j("import", usb / "lost", site=s)
    j("get", "parts", "nope", site=s, code=1)               # the error document
    j("lsepoch", site=b)
    j("chepoch", "bangalore", "boston=0", site=b)
    j("status", site=b)
    j("conflicts", site=b)
    j("conflicts resolve", "parts", "p1", "--value", '{"qty": 10}', site=b)
    j("digest", site=b)
    j("fsck", site=b)
    j("scrub", "--dry-run", site=b)
    j("resync", "--to", "bangalore", "--out", usb / "3", "--create-out", site=b)
    j("log export", root / "log", site=b)
    cfg = root / "batch.toml"
    cfg.write_text(f'site = "{s}"\n[[import]]\npath = "{usb}"\nremove_after_import = true\n'
                   f'[[export]]\nout = "{usb}"\n[scrub]\n'
                   f'[[export]]\nout = "{root / "unmounted"}"\n')
    j("batch", cfg, code=1)
    j("restore", site=g)
    j("rmreplica", "bangalore", site=b)
    assert docs["conflicts"][0]["conflicts"], "the scenario should make a conflict"
    assert docs["status"][0]["parked"], "the scenario should park a packet"
    return docs


def test_the_contract_scenario_runs_every_command(json_documents):
    leaves = {" ".join(p) for p, c in COMMANDS if p and not isinstance(c, click.Group)}
    assert leaves - set(json_documents) <= set(), sorted(leaves - set(json_documents))


def with_referenced(sections: dict[str, str], cmd: str, seen: frozenset = frozenset()) -> str:
    """A section's text plus that of the sections it points to for its fields ("as for
    `export`", "the `lsepoch` document")."""
    text = sections[cmd]
    for other in re.findall(r"as for `([a-z][a-z -]*)`|the `([a-z][a-z -]*)` document", text):
        other = other[0] or other[1]
        if other in sections and other != cmd and other not in seen:
            text += with_referenced(sections, other, seen | {cmd})
    return text


def test_every_json_field_is_documented(json_documents):
    sections = reference_sections()
    error_fields = json_fields({"error": 1, "hint": 1}, set())
    missing = []
    for cmd, docs in json_documents.items():
        text = with_referenced(sections, cmd)
        for field in sorted(set().union(*(json_fields(d, set()) for d in docs))):
            if field in error_fields and f"`{field}`" in sections["Errors in `--json` mode"]:
                continue
            if f"`{field}`" not in text:
                missing.append(f"{cmd}: field `{field}` is not in its section")
    assert not missing, "\n".join(missing)


def test_metric_names_in_the_docs_are_the_real_ones():
    from syncpack.admin.metrics import FAMILIES
    real = {n for n, _, _ in FAMILIES}
    reference = REFERENCE.read_text()
    assert [n for n in sorted(real) if f"`{n}`" not in reference] == []
    for f in doc_files():
        # (file names such as syncpack_boston_hub.prom are not metrics)
        named = set(re.findall(r"\bsyncpack_[a-z_]+[a-z](?![\w.])", f.read_text()))
        named -= {"syncpack_batch"}   # "syncpack_batch_*", the family of batch metrics
        assert named <= real, f"{f.relative_to(ROOT)} names {sorted(named - real)}"
