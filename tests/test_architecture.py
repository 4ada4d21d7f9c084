"""The package's shape: no import cycle, small modules, no untested doctests, errors on stderr."""

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "mirrorkit"
MAX_LINES = 420  # "about 400": a module past it is usually two concerns


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def _imports(name, path):
    """The mirrorkit modules `name` imports when it is imported (module level, not in functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
        elif isinstance(node, ast.If | ast.Try):  # guarded imports still run at import time
            for child in ast.walk(node):
                if isinstance(child, ast.ImportFrom) and child.module:
                    found.add(child.module)
    return found


def _graph():
    names = dict(_modules())
    return {
        name: {m for m in _imports(name, path) if m in names and m != name}
        for name, path in names.items()
    }


def _cycle(graph):
    """One import cycle as a list of modules, or None."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_no_import_cycle_among_mirrorkit_modules():
    graph = _graph()
    # the graph sees real imports:
    assert "mirrorkit.strategies.topology" in graph["mirrorkit.strategies.factory"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("name, path", list(_modules()), ids=lambda v: str(v))
def test_module_stays_small(name, path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines: split it along its concern"


def test_docstring_examples_are_fenced_not_doctests():
    # pytest does not run --doctest-modules on mirrorkit/, so a `>>>` example would never run.
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{i}"
        for _, path in _modules()
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if re.match(r"\s*>>> ", line)
    ]
    assert found == [], f"write these examples as ```python blocks: {found}"


def _declares_a_compat_repair(path) -> bool:
    """A module of compat/ that declares ``REPAIR`` or ``REPAIRS`` (what compat collects)."""
    if path.parent.name != "compat" or path.name.startswith("_"):
        return False
    assigned = {
        target.id
        for node in ast.parse(path.read_text()).body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    return bool(assigned & {"REPAIR", "REPAIRS"})


def test_docs_architecture_names_every_module():
    doc = (PACKAGE.parent / "docs" / "ARCHITECTURE.md").read_text()
    missing = [
        str(path.relative_to(PACKAGE))
        for _, path in _modules()
        if not (path.name == "__init__.py" and path.parent != PACKAGE)  # a subpackage: its modules
        and not _declares_a_compat_repair(path)  # compat.md's table names it (test_compat)
        and f"`{path.relative_to(PACKAGE)}`" not in doc
    ]
    assert missing == [], f"say in one line what each owns in docs/ARCHITECTURE.md: {missing}"


def test_a_command_error_goes_to_stderr(capsys):
    from mirrorkit.commands import cli

    args = cli.build_parser().parse_args(["bench", "--replicas", "0"])
    assert args.run(args) == 2
    said = capsys.readouterr()
    assert said.out == ""
    assert "mirrorkit bench: --replicas counts must be positive" in said.err


# Private internals and processes: where each may be touched (docs/ARCHITECTURE.md).

PRIVATE_MODULES = ("keras.src", "tensorflow.python")
INTERNALS = PACKAGE / "internals.py"
#: Where a computed import name is allowed: the lazy top-level names, the user's model module,
#: the catalogue of the modules that define repairs, and the post-import hook (the module it
#: waits for, and the part of mirrorkit it runs then).
COMPUTED_IMPORTS = (
    PACKAGE / "__init__.py",
    PACKAGE / "patching" / "post_import.py",
    PACKAGE / "bench" / "user_model.py",
    PACKAGE / "patching" / "catalogue.py",
)
IMPORT_CALLS = (
    "importlib.import_module",
    "importlib.__import__",
    "__import__",
    "importlib.util.find_spec",
)
#: Private names of the standard library, not of TensorFlow or Keras.
STDLIB_PRIVATE = ("os._exit", "sys._getframe", "logging.Formatter._fmt")
#: Calls that start a process (besides os.exec* and os.spawn*).
PROCESS_STARTS = (
    "subprocess.Popen", "subprocess.run", "subprocess.call", "subprocess.check_call",
    "subprocess.check_output", "subprocess.getoutput", "subprocess.getstatusoutput",
    "os.system", "os.popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.posix_spawnp",
    "pty.spawn", "pty.fork", "multiprocessing.Process", "multiprocessing.Pool",
    "concurrent.futures.ProcessPoolExecutor", "asyncio.create_subprocess_exec",
    "asyncio.create_subprocess_shell",
)  # fmt: skip
#: Private fields read with a default where the default is part of the reading (a source
#: dataset has no input link), and the module checks its reads on probe pipelines before any
#: use (`batched._verify`: a renamed field is an InternalChangedError naming it).
PROBE_VERIFIED = {
    "pipeline/batched.py": (
        "_input_dataset", "_batch_size", "_drop_remainder", "_reshuffle_each_iteration",
    ),
}  # fmt: skip
#: The section of docs/compat.md that lists every guarded internal.
COMPAT_SECTION = "## Private internals and their guards"


def _private_module(name):
    return any(name == p or name.startswith(p + ".") for p in PRIVATE_MODULES)


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def _own_mark(name):
    return name.startswith("_mirrorkit_")


def _trees(exclude=(INTERNALS,)):
    for _, path in _modules():
        if path not in exclude:
            yield path, ast.parse(path.read_text())


def _where(path, node):
    return f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"


def _dotted(node):
    """``a.b.c`` for a chain of names, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _calls(tree):
    """(call, the dotted name it calls, import aliases resolved: ``sp.run`` is subprocess.run)."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = (
                    a.name if a.asname else a.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _dotted(node.func):
            head, dot, rest = _dotted(node.func).partition(".")
            yield node, aliases.get(head, head) + dot + rest


def _constants(tree):
    """Module-level names bound to a literal: {name: the strings in it}."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name):
            found[target.id] = [
                s
                for c in ast.walk(value)
                for s in (
                    [c.value]
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                    else found.get(c.id, [])
                    if isinstance(c, ast.Name)
                    else []
                )
            ]
    return found


def _strings(node, tree, constants):
    """The strings an argument can be: a literal, a module constant or a name bound from one
    (``for attr in _INTERNALS``, ``module, name = _PER_WORKER``, ``name = "..."``), an
    f-string's parts; None when it cannot be told."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    if isinstance(node, ast.JoinedStr):
        parts = [_strings(getattr(v, "value", v), tree, constants) for v in node.values]
        return [s for p in parts if p for s in p]
    if not isinstance(node, ast.Name):
        return None
    if node.id in constants:
        return constants[node.id]
    for other in ast.walk(tree):
        if isinstance(other, ast.For | ast.comprehension):
            target, source = other.target, other.iter
        elif isinstance(other, ast.Assign) and len(other.targets) == 1:
            target, source = other.targets[0], other.value
        else:
            continue
        if node.id in {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}:
            found = _strings(source, tree, constants)
            if found is not None:
                return found
    return None


def _guarded_names(tree):
    """Every name the module hands to `mirrorkit.internals` (what it guards), as identifiers,
    and the calls whose internal cannot be told."""
    constants, names, unknown = _constants(tree), set(), []
    for call, target in _calls(tree):
        if not target.startswith(("internals.", "mirrorkit.internals.")):
            continue
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            found = _strings(arg, tree, constants)
            if found is None:
                attribute = call.args[1:2] == [arg]
                if attribute and target.endswith((".require", ".optional", ".load")):
                    unknown.append(call)  # the attribute a guard reads must be readable here
                continue
            names |= {w for s in found for w in re.findall(r"[A-Za-z_]\w*", s)}
    return names, unknown


def test_only_internals_imports_private_modules():
    """No ``keras.src`` / ``tensorflow.python`` import outside internals.py: no import
    statement (module level or in a function), and no import by name (importlib,
    ``__import__``) of one; only `COMPUTED_IMPORTS` import by a computed name."""
    found = []
    for path, tree in _trees(exclude=()):
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            if path != INTERNALS and any(_private_module(n) for n in names):
                found.append(f"{_where(path, node)}: {ast.unparse(node)}")
        for call, target in _calls(tree):
            if target not in IMPORT_CALLS or not call.args:
                continue
            arg = call.args[0]
            if isinstance(arg, ast.Constant):
                if path != INTERNALS and _private_module(str(arg.value)):
                    found.append(f"{_where(path, call)}: {ast.unparse(call)}")
            elif path not in (INTERNALS, *COMPUTED_IMPORTS):
                found.append(f"{_where(path, call)}: {ast.unparse(call)} (a computed name)")
    assert found == [], (
        "load private modules through mirrorkit.internals (load_module / load), so an upstream "
        f"move is an InternalChangedError naming it, not an ImportError: {found}"
    )


def test_the_private_import_check_sees_imports():
    tree = ast.parse(
        "import importlib\nfrom keras.src.backend import x\n"
        "def f():\n    import tensorflow.python.distribute\n"
        "    importlib.import_module('keras.src.trainers')\n"
    )
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    named = [getattr(n, "module", None) or n.names[0].name for n in imports]
    assert [_private_module(n) for n in named] == [False, True, True]
    assert [t for _, t in _calls(tree)] == ["importlib.import_module"]


def test_no_private_attribute_is_read_with_a_silent_default():
    """Outside internals.py, ``getattr(obj, "_name", default)`` (the name a literal or a module
    constant) reads only mirrorkit's own marks (``_mirrorkit_*``) or the tf.data fields of
    PROBE_VERIFIED; anything else goes through ``internals.require`` (an error) or
    ``internals.optional`` (a warning)."""
    found, verified = [], {}
    for path, tree in _trees():
        constants = _constants(tree)
        module = str(path.relative_to(PACKAGE))
        named = set()
        for call, target in _calls(tree):
            if target in ("internals.changed", "mirrorkit.internals.changed") and call.args:
                strings = _strings(call.args[0], tree, constants) or []
                named |= {w for s in strings for w in re.findall(r"[A-Za-z_]\w*", s)}
        for call, target in _calls(tree):
            if target != "getattr" or len(call.args) != 3:
                continue
            for name in _strings(call.args[1], tree, constants) or []:
                if name in PROBE_VERIFIED.get(module, ()):
                    verified.setdefault(module, set()).add(name)
                    assert name in named, f"{module} reads {name} with a default, unverified"
                elif _private(name) and not _own_mark(name):
                    found.append(f"{_where(path, call)}: {ast.unparse(call)}")
    assert found == [], (
        "a private TensorFlow/Keras attribute read with a default hides its absence: use "
        f"internals.require (an error) or internals.optional (a warning): {found}"
    )
    assert verified == {m: set(names) for m, names in PROBE_VERIFIED.items()}


def _own_names(tree):
    """Private names the module's own code gives itself: set on ``self``, or a class's own
    attribute or method."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                own.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    own.add(item.name)
                targets = (
                    item.targets
                    if isinstance(item, ast.Assign)
                    else [getattr(item, "target", None)]
                )
                own |= {t.id for t in targets if isinstance(t, ast.Name)}
    return own


def test_private_attributes_outside_internals_are_named_by_a_guard():
    """Outside internals.py, every private attribute touched (``obj._name``, or getattr /
    setattr / hasattr with a literal or constant name) is one the module gives its own objects
    (set on ``self``, a class attribute, a ``_mirrorkit_*`` mark), a standard-library one
    (STDLIB_PRIVATE), or one the module hands to `mirrorkit.internals` (require, optional,
    load, warn, changed), which docs/compat.md then lists."""
    stdlib = {name.rpartition(".")[2] for name in STDLIB_PRIVATE}
    found, unreadable = [], []
    for path, tree in _trees():
        guarded, unknown = _guarded_names(tree)
        unreadable += [_where(path, call) for call in unknown]
        allowed = guarded | _own_names(tree) | stdlib
        constants = _constants(tree)
        touched = [
            (node, node.attr)
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and _private(node.attr)
        ]
        for call, target in _calls(tree):
            if target in ("getattr", "setattr", "hasattr", "delattr") and len(call.args) > 1:
                touched += [(call, n) for n in _strings(call.args[1], tree, constants) or []]
        found += [
            f"{_where(path, node)}: {name}"
            for node, name in touched
            if _private(name) and not _own_mark(name) and name not in allowed
        ]
    assert unreadable == [], f"write the attribute a guard reads so it can be read: {unreadable}"
    assert found == [], (
        "read a private TensorFlow/Keras attribute through mirrorkit.internals (require, "
        f"optional), or name your own mark _mirrorkit_*: {found}"
    )


def test_only_the_launcher_starts_processes():
    """No subprocess / os.exec* / os.spawn* / os.fork / multiprocessing start outside
    ``mirrorkit/launcher/`` (its functions are named for what they start)."""
    found = [
        f"{_where(path, call)}: {target}"
        for path, tree in _trees(exclude=())
        if PACKAGE / "launcher" not in path.parents
        for call, target in _calls(tree)
        if target in PROCESS_STARTS
        or target.startswith(("os.exec", "os.spawn"))
        or (target.startswith("multiprocessing.") and target.endswith(("Process", "Pool")))
    ]
    assert found == [], f"start processes through a function in mirrorkit/launcher/: {found}"


def _step_wrappings(tree):
    """Assignments to ``<x>.train_function`` / ``<x>.train_step`` of anything but None."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute)
        and target.attr in ("train_function", "train_step")
        and not (isinstance(node.value, ast.Constant) and node.value.value is None)
    ]


def test_only_step_hooks_wraps_the_training_step():
    """A wrapper of ``model.train_function`` / ``train_step`` outside the chain is dropped by
    a re-trace and meets the others by accident (issue: ThroughputCallback before NaNGuard
    read every step as host work): register a hook in training/step_hooks instead."""
    found = [
        _where(path, node)
        for path, tree in _trees(exclude=())
        if path != PACKAGE / "training" / "step_hooks.py"
        for node in _step_wrappings(tree)
    ]
    assert found == [], f"wrap the step through mirrorkit.training.step_hooks: {found}"


def test_the_step_wrapping_check_sees_a_wrapper():
    tree = ast.parse("model.train_function = timed\nmodel.train_function = None\n")
    assert [node.lineno for node in _step_wrappings(tree)] == [1]


#: Writers to stderr that are not notices, and why a user's logging must not silence them.
STDERR_NOT_NOTICES = {
    "bench/sweep.py": "mirrorkit bench's progress lines, a command's own output",
    "bench/results.py": "mirrorkit bench's hint to install matplotlib for its PNG",
    "strategies/_peer_wait_watcher.py": "a watcher process's last words before it kills the job",
    "faults/step_timeout.py": "a hung step's last words, before the stacks and the exit",
}


def test_notices_go_through_the_logger():
    """No ``print(..., file=sys.stderr)`` or ``sys.stderr.write`` in mirrorkit/ outside the
    command-line entry points (commands/, whose errors go to stderr by design), the
    launcher's relay of its workers' own output and `STDERR_NOT_NOTICES`: a notice is
    ``chief.say``, which a user can silence or redirect."""
    found = []
    for path, tree in _trees(exclude=()):
        if PACKAGE / "commands" in path.parents or path.parent == PACKAGE / "launcher":
            continue
        if str(path.relative_to(PACKAGE)) in STDERR_NOT_NOTICES:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = _dotted(node.func)
            to_stderr = any(
                k.arg == "file" and _dotted(k.value) == "sys.stderr" for k in node.keywords
            )
            if (name == "print" and to_stderr) or name == "sys.stderr.write":
                found.append(_where(path, node))
    assert found == [], f"say notices through mirrorkit.cluster.chief.say: {found}"


#: Top-level packages whose modules and classes mirrorkit patches only through patching/.
FOREIGN_PACKAGES = ("tensorflow", "keras", "tf_keras", "keras_hub", "keras_tuner", "keras_rs")
#: Calls that return a module, class or attribute of TensorFlow or Keras.
FOREIGN_LOADS = ("internals.load", "internals.load_module", "internals.require", "getattr")


def _foreign_names(tree):
    """The names a module binds to TensorFlow or Keras objects: ``tf``, ``keras``, what it
    imports from their modules, what ``internals.load`` (and the like) returns, and names
    bound to a chain of those (``cls = tf.distribute.MirroredStrategy``)."""
    foreign = {"tf", "keras"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FOREIGN_PACKAGES:
                    foreign.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and not node.level:
            if (node.module or "").split(".")[0] in FOREIGN_PACKAGES:
                foreign |= {alias.asname or alias.name for alias in node.names}
    # a function or class the module defines is its own, whatever else it binds by that name
    own = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    foreign -= own
    changed = True
    while changed:  # names bound from other foreign names, until nothing new
        changed = False
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            value = node.value
            if isinstance(value, ast.Call):
                loads = _dotted(value.func) in FOREIGN_LOADS and (
                    _dotted(value.func) != "getattr" or _roots_in(value.args[:1], foreign)
                )
            else:
                loads = _roots_in([value], foreign)
            for target in node.targets:
                if loads and isinstance(target, ast.Name) and target.id not in foreign | own:
                    foreign.add(target.id)
                    changed = True
    return foreign


def _roots_in(nodes, names):
    """Whether each of `nodes` is a name of `names`, or a chain of attributes on one."""
    if not nodes:
        return False
    for node in nodes:
        while isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        if not (isinstance(node, ast.Name) and node.id in names):
            return False
    return True


def _assigned(node):
    """The targets an assignment statement writes (tuples unpacked)."""
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = list(node.targets)
    else:
        return []
    found = []
    while targets:
        target = targets.pop()
        if isinstance(target, ast.Tuple | ast.List):
            targets.extend(target.elts)
        else:
            found.append(target)
    return found


def _foreign_patches(tree):
    """Every write to an attribute of a TensorFlow or Keras module or class (or object): an
    assignment, augmented or annotated, a ``del``, a tuple unpacked into one, ``setattr`` /
    ``delattr`` / ``object.__setattr__``, a write into its ``__dict__`` or ``vars()``, on a
    name bound to TensorFlow or Keras (`_foreign_names`) or a chain of attributes on one."""
    foreign = _foreign_names(tree)
    found = []
    for node in ast.walk(tree):
        for target in _assigned(node):
            if isinstance(target, ast.Attribute) and _roots_in([target.value], foreign):
                found.append(node)
            elif isinstance(target, ast.Subscript) and _writes_a_namespace(target.value, foreign):
                found.append(node)
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name in ("setattr", "delattr", "object.__setattr__", "type.__setattr__"):
                if _roots_in(node.args[:1], foreign):
                    found.append(node)
    return sorted(set(found), key=lambda node: node.lineno)


def _writes_a_namespace(node, foreign):
    """``X.__dict__`` or ``vars(X)`` for a foreign X."""
    if isinstance(node, ast.Attribute) and node.attr == "__dict__":
        return _roots_in([node.value], foreign)
    if isinstance(node, ast.Call) and _dotted(node.func) == "vars":
        return _roots_in(node.args[:1], foreign)
    return False


#: The modules that patch TensorFlow and Keras: the one mechanism.
PATCHING = (PACKAGE / "patching" / "repair.py", PACKAGE / "patching" / "instance.py")


def test_every_patch_of_tensorflow_or_keras_goes_through_the_repair_registry():
    """A module, class or object of TensorFlow/Keras is patched only through patching/ (a
    `Repair`, or `instance.set_on` for one object), so ``compat.describe()`` lists it and
    ``compat.disable()`` takes it off."""
    found = [
        _where(path, node)
        for path, tree in _trees(exclude=())
        if path not in PATCHING
        for node in _foreign_patches(tree)
    ]
    assert found == [], f"patch TensorFlow/Keras through patching/ (a Repair): {found}"


#: Each form of patching the guard must see, one per line, and lines it must let pass.
PATCH_FORMS = """\
import keras
import tensorflow as tf
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
from keras.src.backend.tensorflow import trainer as trainer_module
keras.Model.fit = f
setattr(keras.Model, "fit", f)
TensorFlowTrainer.make_train_function = f
tf.distribute.MirroredStrategy._collective_key_base = 7
trainer_module.TensorFlowTrainer._make_function = f
cls = tf.distribute.MirroredStrategy
cls._key = 1
loaded = internals.load_module("x", used_for="y")
loaded.tf = proxy
delattr(keras.callbacks.CSVLogger, "on_train_end")
keras.Model.fit, other = f, 1
vars(keras.Model)["fit"] = f
keras.Model.__dict__["fit"] = f
object.__setattr__(keras.Model, "fit", f)
keras.Model.fit: Any = f
del keras.Model.fit
model.train_function = None
instance.set_on(model, "train_function", f, name="x", reason="y")
mine = SomethingOfMine()
mine.attribute = 1
"""


def test_the_patch_check_sees_every_form_of_patch():
    lines = PATCH_FORMS.splitlines()
    seen = [node.lineno for node in _foreign_patches(ast.parse(PATCH_FORMS))]
    expected = [n for n, line in enumerate(lines, 1) if n in range(5, 21) and n not in (10, 12)]
    assert seen == expected, [lines[n - 1] for n in sorted(set(seen) ^ set(expected))]


def test_the_process_check_sees_a_start():
    tree = ast.parse("import subprocess as sp\nimport os\nsp.run(['x'])\nos.execv('x', [])\n")
    assert [t for _, t in _calls(tree)] == ["subprocess.run", "os.execv"]


def _compat_internals_section():
    """The section as the site shows it: the table of each repair's target made in."""

    text = (PACKAGE.parent / "docs" / "compat.md").read_text()
    assert COMPAT_SECTION in text, f"docs/compat.md lost its section {COMPAT_SECTION!r}"
    section = text.split(COMPAT_SECTION, 1)[1].split("\n## ", 1)[0]
    from _docs_tables import tables as loaded

    tables = loaded()
    marker = next(line for line in tables.GENERATED if tables.GENERATED[line] == "targets_table")
    assert marker in section, f"{COMPAT_SECTION!r} lost its line {marker!r}"
    return section.replace(marker, tables.targets_table())


def _guarded_internals():
    """{internal: where}: each attribute a guard of mirrorkit.internals reads (require,
    optional, load: the attribute and the private module's last part) and each compat
    repair's target ``Class.method``."""
    found = {}

    def add(name, path, call):  # a private module by its last part, as the table names it
        found.setdefault(
            name.rpartition(".")[2] if _private_module(name) else name, _where(path, call)
        )

    for path, tree in _trees():
        constants = _constants(tree)
        for call, target in _calls(tree):
            fn = target.rpartition(".")[2]
            if target.startswith(("internals.", "mirrorkit.internals.")) and fn in (
                "require", "optional", "load", "load_module"
            ):  # fmt: skip
                args = call.args[1:2] if fn != "load_module" else []
                for arg in args:
                    for name in _strings(arg, tree, constants) or []:
                        add(name, path, call)
                if fn in ("load", "load_module") and call.args:
                    for module in _strings(call.args[0], tree, constants) or []:
                        add(module, path, call)
            elif fn in ("Repair", "multi_worker_repair"):
                given = {k.arg: k.value for k in call.keywords}
                if "target" in given or len(call.args) > 2:
                    node = given.get("target", call.args[2] if len(call.args) > 2 else None)
                    for name in _strings(node, tree, constants) or []:
                        add(name, path, call)
    return found


def test_docs_compat_lists_every_guarded_internal():
    """Every internal a guard reads, and every repair's target, is named in docs/compat.md's
    internals table (a target ``Class.method`` as both words in one row)."""
    rows = _compat_internals_section().splitlines()
    internals = _guarded_internals()
    assert "_all_reduce_sum_gradients" in internals  # the collector sees the guards
    assert "TensorFlowTrainer._make_function" in internals  # and the repairs' targets

    def listed(name):
        words = name.split(".")
        return any(
            all(re.search(rf"(?<!\w){re.escape(w)}(?!\w)", row) for w in words) for row in rows
        )

    missing = sorted(f"{name} ({where})" for name, where in internals.items() if not listed(name))
    assert missing == [], f"list these in docs/compat.md, {COMPAT_SECTION!r}: {missing}"


def test_the_package_ships_py_typed_beside_its_stub():
    """Type checkers read the package's hints (PEP 561) only with the marker."""
    assert (PACKAGE / "py.typed").is_file() and (PACKAGE / "__init__.pyi").is_file()


def test_the_suites_xdist_scheduler_guards_the_private_methods_it_overrides():
    import conftest
    from xdist.scheduler import LoadScopeScheduling

    assert conftest._changed_xdist_internals(LoadScopeScheduling) == []

    class Renamed(LoadScopeScheduling):
        _split_scope = None

        def _assign_work_unit(self, node, extra):
            pass

    assert conftest._changed_xdist_internals(Renamed) == [
        "LoadScopeScheduling._split_scope",
        "LoadScopeScheduling._assign_work_unit",
    ]
