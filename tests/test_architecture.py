"""The shape of the code that docs/architecture.md describes: imports go only down the layers, no import cycle,
nothing that uses a reward model imports the trainer, no module over 450 lines.

Read from the source (every import, module-level or inside a function), so a violation fails here before review.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "trl_rm_env"
RECIPES = ROOT / "recipes"  # installed as the package `trl_rm_env.recipes` (pyproject.toml's package-dir)
MAX_LINES = 450

# docs/architecture.md, "The layers", top to bottom: a module may import its own layer and the ones below it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("entry points", ("trl_rm_env", "__main__", "recipes")),
    ("training", ("trainer",)),
    ("using a reward model", ("judges", "serving", "evaluation", "rewards")),
    ("scoring", ("scoring",)),
    ("model runtime", ("runtime",)),
    ("shared by training and scoring", ("tokenization", "sharing", "heads", "metrics", "fused_kernels")),
    ("data", ("data",)),
    ("base", ("errors", "waiting", "model_source", "tiny_models", "real_models", "distributed", "compat", "lazy", "options", "quiet")),
)
USERS_OF_A_REWARD_MODEL = ("judges", "scoring", "runtime", "serving", "evaluation", "rewards")


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The syntax tree of one source file, parsed once per run (the tests only read it)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def module_name(path: Path, package: Path = PACKAGE) -> str:
    if path.is_relative_to(RECIPES):  # the checkout's recipes/ is the installed trl_rm_env.recipes
        path = PACKAGE / "recipes" / path.relative_to(RECIPES)
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, package: Path = PACKAGE) -> list[tuple[str, int]]:
    """`(imported module, line)` for every import of the package in `path`, relative ones resolved, at any depth."""
    name = module_name(path, package)
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:  # `from . import nemo` imports the module `nemo`
                submodule = f"{target}.{alias.name}"
                where = package.parent / submodule.replace(".", "/")
                if package == PACKAGE and submodule.startswith("trl_rm_env.recipes."):
                    where = RECIPES / submodule.removeprefix("trl_rm_env.recipes.").replace(".", "/")
                is_module = where.with_suffix(".py").exists() or (where / "__init__.py").exists()
                found.append((submodule if is_module else target, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
    return [(target, line) for target, line in found if target.split(".")[0] == package.name]


def layer_of(module: str) -> int:
    """The index of `module`'s layer (its longest matching entry in LAYERS)."""
    best, best_length = None, -1
    for index, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            full = "trl_rm_env" if entry == "trl_rm_env" else f"trl_rm_env.{entry}"
            matches = module == full or (entry != "trl_rm_env" and module.startswith(full + "."))
            if matches and len(full) > best_length:
                best, best_length = index, len(full)
    if best is None:
        pytest.fail(f"{module} has no layer: add it to LAYERS here and to the table in docs/architecture.md")
    return best


def package_modules() -> dict[str, Path]:
    paths = [*sorted(PACKAGE.rglob("*.py")), *sorted(RECIPES.glob("*.py"))]
    return {module_name(path): path for path in paths}


def test_the_import_reader_sees_relative_lazy_and_submodule_imports(tmp_path):
    package = tmp_path / "trl_rm_env"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "base.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import leaf\n")
    (package / "sub" / "leaf.py").write_text("")
    (package / "sub" / "user.py").write_text(
        "import os\nfrom ..base import x\n\ndef f():\n    from trl_rm_env.sub.leaf import y\n    import trl_rm_env\n"
    )
    assert imports(package / "sub" / "user.py", package) == [
        ("trl_rm_env.base", 2),
        ("trl_rm_env.sub.leaf", 5),
        ("trl_rm_env", 6),
    ]
    assert imports(package / "sub" / "__init__.py", package) == [("trl_rm_env.sub.leaf", 1)]


def test_every_module_has_a_layer_and_imports_only_go_down():
    upward = []
    for name, path in package_modules().items():
        mine = layer_of(name)
        for target, line in imports(path):
            if name.startswith(target + ".") or target == name:
                continue  # a module's own package (its `__init__`), or itself
            if layer_of(target) < mine:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {LAYERS[mine][0]} imports {target} "
                              f"({LAYERS[layer_of(target)][0]})")  # fmt: skip
    assert not upward, "imports that go up the layers of docs/architecture.md:\n" + "\n".join(upward)


def test_no_import_cycle():
    modules = package_modules()
    graph = {name: {t for t, _ in imports(path) if t in modules and t != name} for name, path in modules.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_nothing_that_uses_a_reward_model_imports_the_trainer():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
        for name, path in package_modules().items()
        if name.split(".")[1:2] and name.split(".")[1] in USERS_OF_A_REWARD_MODEL
        for target, line in imports(path)
        if target == "trl_rm_env.trainer" or target.startswith("trl_rm_env.trainer.")
    ]
    assert not offenders, "\n".join(offenders)


def test_every_reward_function_lives_in_rewards_on_one_base_with_one_call():
    """One room for the reward functions: each public one is defined under `trl_rm_env.rewards`, reached by its name
    from the package, and built on `Reward`, whose one generator (`_steps`) runs synchronously or awaited: no reward
    function defines its own `__call__` or a second, async copy of its call."""
    import trl_rm_env
    from trl_rm_env.rewards.attributes import AttributeReward
    from trl_rm_env.rewards.base import Reward, RewardFunction

    names = ("RewardModelEnvironment", "RemoteRewardModelEnvironment", "JudgeEnvironment", "CascadeReward",
             "EnsembleReward")  # fmt: skip
    assert {n: getattr(trl_rm_env, n).__module__.split(".")[1] for n in names} == dict.fromkeys(names, "rewards")
    classes = [getattr(trl_rm_env, n) for n in names] + [AttributeReward]
    assert all(issubclass(c, Reward) and "_steps" in vars(c) or c.__base__ in classes for c in classes)
    assert all(issubclass(getattr(trl_rm_env, n), RewardFunction) for n in names[:3])  # the combinators are not
    assert AttributeReward.__module__ == "trl_rm_env.rewards.attributes"
    own_calls = [
        f"{c.__name__}.{member}"
        for c in classes
        for member in ("__call__", "_call", "_call_async", "_drive", "_rewards", "_rewards_async")
        if member in vars(c)
    ]
    assert not own_calls, own_calls


def test_judges_load_through_the_runtime_not_the_reward_models_scorer():
    """One model runtime (`trl_rm_env.runtime`): a judge is planned and loaded by it as a reward model is, and
    nothing in `judges/` reaches into the reward model's scorer (`trl_rm_env.scoring`)."""
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
        for name, path in package_modules().items()
        if name.startswith("trl_rm_env.judges.")
        for target, line in imports(path)
        if target == "trl_rm_env.scoring" or target.startswith("trl_rm_env.scoring.")
    ]
    assert not offenders, "\n".join(offenders)


def test_entry_points_only_parse_raising_nothing_but_system_exit_and_each_main_reads_in_under_60_lines():
    """Policy (refusals, engine choice, checks across options) is the library's, raised for a library user too; a
    recipe parses, calls and prints. A bare `raise` (re-raising under `--debug`) is no new error."""
    found, long = [], {}
    for path in sorted(RECIPES.glob("*.py")):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Raise) and node.exc is not None:
                raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if getattr(raised, "id", None) != "SystemExit":
                    found.append(f"recipes/{path.name}:{node.lineno} raises {ast.unparse(raised)}")
            if isinstance(node, ast.FunctionDef) and node.name == "main" and node.end_lineno - node.lineno >= 60:
                long[f"recipes/{path.name}"] = node.end_lineno - node.lineno + 1
    assert not found, found
    assert not long, f"recipe mains of 60 lines or more: {long}"


def test_no_module_over_450_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for path in package_modules().values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them by concept): {long}"


def only_reexports(source: str) -> bool:
    """Whether a module's body is nothing but imports (a docstring, `__all__` and `if __name__ == "__main__"` aside):
    an old path kept for a name that lives elsewhere."""
    body = ast.parse(source).body
    body = body[1:] if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else body
    rest = [
        node for node in body
        if not (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"])
        and not (isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))
    ]  # fmt: skip
    return bool(rest) and all(isinstance(node, (ast.Import, ast.ImportFrom)) for node in rest)


def test_a_module_name_repeats_only_where_the_architecture_page_says_why():
    """Two modules share a basename only when they hold the same kind of thing for different layers, and
    docs/architecture.md ("Names that repeat") names every place of each such name."""
    import collections
    import re

    places = collections.defaultdict(list)
    for path in [*PACKAGE.rglob("*.py"), *RECIPES.glob("*.py")]:
        if path.name != "__init__.py":
            folder = "recipes" if path.is_relative_to(RECIPES) else path.parent.relative_to(PACKAGE).as_posix()
            places[path.name].append(folder)
    repeated = {name: sorted(dirs) for name, dirs in places.items() if len(dirs) > 1}
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page.split("### Names that repeat", 1)[1].split("\n## ", 1)[0]
    explained = {}
    for row in section.splitlines():
        cells = row.split("|")
        if len(cells) > 3 and cells[1].strip().startswith("`"):
            explained[cells[1].strip().strip("`")] = sorted(re.findall(r"`([\w/]+)/`", cells[2]))
    assert repeated == explained, f"repeated basenames {repeated}; the page explains {explained}"


def test_every_package_folder_ships_in_the_wheel():
    """pyproject.toml lists the packages the wheel carries: a new folder of modules missing there imports from a
    checkout and fails once installed."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {module_name(init) for init in PACKAGE.rglob("__init__.py")}
    assert folders - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def test_no_module_only_reexports_another():
    assert only_reexports('"""Moved."""\nfrom .other import a, b  # noqa: F401\n')
    assert not only_reexports('"""Real."""\nfrom .other import a\n\nB = a + 1\n')
    shims = [
        str(path.relative_to(ROOT)) for path in package_modules().values()
        if path.name != "__init__.py" and only_reexports(path.read_text(encoding="utf-8"))
    ]  # fmt: skip
    assert not shims, f"modules that only re-export other modules' names (import from where they live): {shims}"


TEST_STATE = ("_LAYER_CALLS", "last_batch_shapes", "last_key_shapes", "last_shared", "num_forwards")


def test_production_objects_keep_no_state_for_tests():
    """What a test wants to see of a call (its passes' shapes, the items shared, the forwards made) it watches from
    outside (`helpers.watch_passes`, a forward hook): no attribute every call writes for it."""
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno} {name}"
        for path in package_modules().values()
        for node in ast.walk(parsed(path))
        for name in [node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)]
        if name in TEST_STATE
    ]  # fmt: skip
    assert not found, found


def mode_name_tests(path: Path) -> list[int]:
    """The lines of `path` that compare something with a built-in judge mode's name (`==`, `!=`, `in`), or index a
    mapping by one."""
    names = {"pointwise", "pairwise", "listwise"}

    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        return isinstance(node, ast.Tuple | ast.List | ast.Set) and any(named(e) for e in node.elts)

    lines = []
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Compare) and any(named(n) for n in [node.left, *node.comparators]):
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and named(node.slice):
            lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and any(k is not None and named(k) for k in node.keys):
            lines.append(node.lineno)
    return sorted(lines)


def layout_name_tests(path: Path) -> list[int]:
    """The lines of `path` that compare something with a layout's name (`==`, `!=`, `in`: `"packed" in batch` too)."""
    names = {"plain", "packed", "kv", "mask"}

    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and node.value.lower() in names
        return isinstance(node, ast.Tuple | ast.List | ast.Set) and any(named(e) for e in node.elts)

    return sorted(
        node.lineno for node in ast.walk(parsed(path))
        if isinstance(node, ast.Compare) and any(named(n) for n in [node.left, *node.comparators])
    )  # fmt: skip


def test_layouts_are_objects_nothing_outside_sharing_tests_a_layout_name(tmp_path):
    """The layout is chosen once (`sharing.training_layout`, `sharing.layouts.scoring_layout`) and asked, never
    re-derived from a name or from a batch's keys; one collator class for every layout, parameterized by the layout
    object (and the regression one), so no table maps layouts to collators."""
    probe = tmp_path / "probe.py"
    probe.write_text('if layout == "packed":\n    pass\nx = "kv" in batch\ny = mode in (True, "PACKED")\n')
    assert layout_name_tests(probe) == [1, 3, 4]
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in [*package_modules().values(), *RECIPES.rglob("*.py")]
        if "sharing" not in path.relative_to(ROOT).parts[:2]
        for line in layout_name_tests(path)
    ]
    assert not offenders, f"a layout's name tested outside sharing/ (ask the layout object): {offenders}"
    from transformers.data.data_collator import DataCollatorMixin

    from trl_rm_env.sharing import layouts
    from trl_rm_env.trainer import collator

    collators = [c for c in vars(collator).values() if isinstance(c, type) and issubclass(c, DataCollatorMixin)
                 and c.__module__ == collator.__name__]  # fmt: skip
    assert sorted(c.__name__ for c in collators) == ["DataCollatorForRankedPreference", "DataCollatorForRegression",
                                                     "_RightPadding"]  # fmt: skip
    every = [layout for layout in vars(layouts).values() if isinstance(layout, layouts.Layout)]
    assert sorted(layout.name for layout in every) == ["kv", "mask", "packed", "plain"]
    examples = [{"completion_ids": [[5, 6, 7], [5, 6, 8, 9]], "ranks": [0, 1]}]
    for layout in every:  # each layout's batch from the one class: the layout's tokens, ranks and records
        batch = collator.DataCollatorForRankedPreference(pad_token_id=0, layout=layout)(examples)
        assert batch["ranks"].tolist() == [0, 1] and batch["record_index"].tolist() == [0, 0], layout


def test_only_the_modes_module_tests_a_judge_modes_name(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('if mode == "pairwise":\n    x = {"listwise": 1}\ny = T["pointwise"]\nz = mode in ("a", "pointwise")\n')
    assert mode_name_tests(probe) == [1, 2, 3, 4]  # the reader sees each way of testing a name
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in [*package_modules().values(), *RECIPES.rglob("*.py")]
        if path != PACKAGE / "judges" / "builtin_modes.py"
        for line in mode_name_tests(path)
    ]
    assert not offenders, f"a judge mode's name tested outside judges/builtin_modes.py (ask the mode instead): {offenders}"


def _importable(module, name: str) -> bool:
    """`from <module> import <name>` works: an attribute, or a submodule."""
    import importlib

    if hasattr(module, name):
        return True
    try:
        importlib.import_module(f"{module.__name__}.{name}")
    except ModuleNotFoundError:
        return False
    return True


def test_scripts_import_only_what_the_package_has():
    """The recipes and benchmarks import the package inside functions, where a moved name would only fail when
    that path runs: every name they import must exist."""
    import importlib

    missing = []
    for folder in ("recipes", "benchmarks"):
        for path in sorted((PACKAGE.parent / folder).glob("*.py")):
            for node in ast.walk(parsed(path)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "trl_rm_env":
                    module = importlib.import_module(node.module)
                    missing += [f"{folder}/{path.name}:{node.lineno}: {node.module}.{alias.name}"
                                for alias in node.names if not _importable(module, alias.name)]  # fmt: skip
    assert not missing, "\n".join(missing)


def test_the_architecture_page_names_only_what_exists():
    """docs/architecture.md is the layout of record: every file or folder it names exists, and every dotted name it
    gives (`runtime.plan.plan_model`, `trl_rm_env.sharing.kv`) imports."""
    import importlib
    import re

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    tokens = set(re.findall(r"`([^`\s()]+)`", text))
    files = [*PACKAGE.rglob("*.py"), *RECIPES.glob("*.py")]
    missing = []
    for token in sorted(t for t in tokens if t.endswith((".py", "/"))):
        path = token.rstrip("/")
        if not any((base / path).exists() for base in (PACKAGE, ROOT)) and not any(f.name == path for f in files):
            missing.append(token)
    subpackages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    for token in sorted(t for t in tokens if re.fullmatch(r"[a-z_][\w]*(\.\w+)+", t)):
        parts = token.removeprefix("trl_rm_env.").split(".")
        if parts[0] not in subpackages | modules or token.endswith((".py", ".md", ".yaml")):
            continue  # not a name of ours (`torch.float32`, a file name)
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module("trl_rm_env." + ".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for attribute in parts[cut:]:
                obj = getattr(obj, attribute, None)
            break
        else:
            obj = None
        if obj is None:
            missing.append(token)
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"
