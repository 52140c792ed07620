"""The deployment material under infra/ and the Dockerfile: well-formed, and consistent with
each other and with the bridge's own configuration (ports, paths, the shutdown deadline).

Nothing here needs a cluster, a cloud or Docker: manifests are read as YAML, the Dockerfile is
parsed instruction by instruction, and Terraform is only checked by ``terraform fmt``.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.config import BridgeConfig, parse_config

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
KUBERNETES = INFRA / "kubernetes"
TERRAFORM = INFRA / "terraform"
DOCKERFILE = ROOT / "Dockerfile"

MANIFESTS = sorted([*KUBERNETES.glob("*.yaml"), *KUBERNETES.glob("*.yml")])
CONFIG_DIR = "/etc/fencebridge"
HEALTH_PORT = 8080


# -- Kubernetes -------------------------------------------------------------------------------


def documents(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [d for d in yaml.safe_load_all(handle) if d is not None]


@functools.cache
def objects() -> tuple[dict[str, Any], ...]:
    return tuple(d for path in MANIFESTS for d in documents(path))


def the(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        o
        for o in objects()
        if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def bridge_config() -> BridgeConfig:
    data = the("ConfigMap")["data"]
    assert list(data) == ["bridge.toml"]
    return parse_config(data["bridge.toml"], file="infra/kubernetes/configmap.yaml")


def test_there_are_manifests() -> None:
    assert {p.name for p in MANIFESTS} >= {
        "deployment.yaml",
        "configmap.yaml",
        "horizontalpodautoscaler.yaml",
        "poddisruptionbudget.yaml",
        "serviceaccount.yaml",
        "job-migrate.yaml",
        "kustomization.yaml",
    }


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_is_a_named_object(path: Path) -> None:
    docs = documents(path)
    assert docs, f"{path.name} holds no object"
    for doc in docs:
        assert isinstance(doc, dict)
        assert isinstance(doc.get("apiVersion"), str)
        assert doc["apiVersion"]
        assert isinstance(doc.get("kind"), str)
        assert doc["kind"]
        assert isinstance(doc.get("metadata"), dict)
        assert isinstance(doc["metadata"].get("name"), str)
        assert doc["metadata"]["name"]


def test_the_kustomization_lists_every_object_but_the_migration_job() -> None:
    kustomization = the("Kustomization")
    listed = set(kustomization["resources"])
    assert all((KUBERNETES / name).is_file() for name in listed)
    others = {p.name for p in MANIFESTS} - {"kustomization.yaml"}
    # Applying the manifests must never migrate: the Job is run on purpose, on its own.
    assert others - listed == {"job-migrate.yaml"}


def test_kubectl_renders_the_kustomization() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; the kustomization is checked as YAML above")
    result = subprocess.run(
        [kubectl, "kustomize", str(KUBERNETES)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rendered = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert {d["kind"] for d in rendered} >= {"Deployment", "HorizontalPodAutoscaler"}


def bridge_container() -> dict[str, Any]:
    containers = the("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def probe_target(probe: dict[str, Any], container: dict[str, Any]) -> tuple[str, int]:
    """The path and numeric port an httpGet probe hits (named ports resolved)."""
    get = probe["httpGet"]
    port = get["port"]
    if isinstance(port, str):
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        port = named[port]
    return get["path"], int(port)


def test_the_deployment_probes_the_bridge_health_endpoints() -> None:
    container = bridge_container()
    config = bridge_config()
    port = config.bridge.health_port
    assert probe_target(container["readinessProbe"], container) == ("/readyz", port)
    assert probe_target(container["livenessProbe"], container) == ("/healthz", port)
    assert probe_target(container["startupProbe"], container)[1] == port
    # The kubelet reaches the pod's IP, not its loopback.
    assert config.bridge.health_host == "0.0.0.0"


def test_the_grace_period_outlasts_the_shutdown_deadline() -> None:
    pod = the("Deployment")["spec"]["template"]["spec"]
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > bridge_config().bridge.shutdown_deadline_seconds


def test_the_deployment_runs_locked_down() -> None:
    pod = the("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    container = bridge_container()
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"]["cpu"]
    assert container["resources"]["requests"]["memory"]
    assert container["resources"]["limits"]["memory"]


def test_config_comes_from_the_configmap_and_the_secrets_from_secrets() -> None:
    deployment = the("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = bridge_container()
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_mounts = [m for m in mounts.values() if m["mountPath"] == CONFIG_DIR]
    assert len(config_mounts) == 1
    assert config_mounts[0]["readOnly"] is True
    volume = volumes[config_mounts[0]["name"]]
    assert volume["configMap"]["name"] == the("ConfigMap")["metadata"]["name"]
    assert container["args"] == ["run", "--config", f"{CONFIG_DIR}/bridge.toml"]
    env = {e["name"]: e for e in container["env"]}
    database = env["FENCEBRIDGE_DATABASE_URL"]
    assert "value" not in database
    assert database["valueFrom"]["secretKeyRef"]["name"]
    assert "migrate" not in container["args"]
    # `run` refuses to start without the identity key: it comes from a Secret, like the URL
    for name in ("FENCEBRIDGE_IDENTITY_KEY", "FENCEBRIDGE_IDENTITY_PREVIOUS_KEYS"):
        assert "value" not in env[name]
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "fencebridge-identity"
    assert env["FENCEBRIDGE_IDENTITY_PREVIOUS_KEYS"]["valueFrom"]["secretKeyRef"]["optional"]


def test_the_autoscaler_scales_the_deployment_on_an_external_backlog_metric() -> None:
    deployment = the("Deployment")
    hpa = the("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert hpa["metadata"].get("namespace") == deployment["metadata"].get("namespace")
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    kinds = [m["type"] for m in hpa["spec"]["metrics"]]
    assert kinds == ["External"]
    # The autoscaler owns the replica count; a fixed count would fight it on every apply.
    assert "replicas" not in deployment["spec"]


def test_the_disruption_budget_covers_the_deployment_pods() -> None:
    pdb = the("PodDisruptionBudget")
    deployment = the("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"] == selector
    assert pdb["spec"]["maxUnavailable"] == 1


def test_the_migration_job_runs_migrate_once_as_the_migrator() -> None:
    job = the("Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["args"] == ["migrate"]
    secret = container["env"][0]["valueFrom"]["secretKeyRef"]["name"]
    bridge_secret = bridge_container()["env"][0]["valueFrom"]["secretKeyRef"]["name"]
    assert container["env"][0]["name"] == "FENCEBRIDGE_DATABASE_URL"
    assert secret != bridge_secret, "the bridge's credentials must not be able to migrate"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


# -- Dockerfile -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with line continuations joined and comments dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a line continuation"
    return instructions


def stages(instructions: list[Instruction]) -> tuple[dict[str, str], list[list[Instruction]]]:
    """Global ARG defaults, and the instructions of each stage (each list starts with FROM)."""
    arguments: dict[str, str] = {}
    result: list[list[Instruction]] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            result.append([ins])
        elif result:
            result[-1].append(ins)
        elif ins.keyword == "ARG":
            name, _, default = ins.args.partition("=")
            arguments[name] = default.strip('"')
    return arguments, result


def substitute(text: str, arguments: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: arguments[m.group(1) or m.group(2)], text)


def exec_form(ins: Instruction) -> list[str]:
    value = json.loads(ins.args)
    assert isinstance(value, list)
    assert all(isinstance(v, str) for v in value)
    return value


@pytest.fixture(scope="module")
def dockerfile() -> tuple[dict[str, str], list[list[Instruction]]]:
    return stages(parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8")))


def final_stage(dockerfile: tuple[dict[str, str], list[list[Instruction]]]) -> list[Instruction]:
    return dockerfile[1][-1]


def only(stage: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in stage if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword} in the final stage, found {len(found)}"
    return found[0]


PINNED = re.compile(
    r"^[\w./-]+"  # repository
    r"(?::(?P<tag>[\w.-]+))?"
    r"(?:@sha256:(?P<digest>[0-9a-f]{64}))?$"
)


def test_the_dockerfile_is_multi_stage_from_pinned_images(
    dockerfile: tuple[dict[str, str], list[list[Instruction]]],
) -> None:
    arguments, all_stages = dockerfile
    assert len(all_stages) >= 2
    names: set[str] = set()
    for stage in all_stages:
        image, *rest = substitute(stage[0].args, arguments).split()
        if rest:
            assert [r.upper() for r in rest[:1]] == ["AS"]
            names.add(rest[1])
        if image in names:
            continue
        match = PINNED.match(image)
        assert match, f"unreadable image reference {image!r}"
        tag, digest = match.group("tag"), match.group("digest")
        exact_version = tag is not None and re.match(r"^\d+\.\d+\.\d+", tag) is not None
        assert digest or exact_version, f"{image} is pinned neither by digest nor by version"
        assert tag != "latest"


def test_the_final_stage_runs_fencebridge_as_a_fixed_non_root_user(
    dockerfile: tuple[dict[str, str], list[list[Instruction]]],
) -> None:
    stage = final_stage(dockerfile)
    user, _, _group = only(stage, "USER").args.partition(":")
    assert user not in {"root", "0"}
    # Numeric, so Kubernetes can verify runAsNonRoot, and the one the manifests expect.
    assert user.isdigit()
    pod = the("Deployment")["spec"]["template"]["spec"]
    assert int(user) == pod["securityContext"]["runAsUser"]
    assert exec_form(only(stage, "ENTRYPOINT")) == ["fencebridge"]
    assert exec_form(only(stage, "CMD")) == bridge_container()["args"]
    assert only(stage, "STOPSIGNAL").args == "SIGTERM"
    assert only(stage, "EXPOSE").args.split("/")[0] == str(bridge_config().bridge.health_port)
    env = " ".join(i.args for i in stage if i.keyword == "ENV")
    assert re.search(r"\bPYTHONDONTWRITEBYTECODE=1\b", env)
    assert re.search(r"\bPYTHONUNBUFFERED=1\b", env)


def test_the_final_stage_installs_no_build_tools(
    dockerfile: tuple[dict[str, str], list[list[Instruction]]],
) -> None:
    runs = " ".join(i.args for i in final_stage(dockerfile) if i.keyword == "RUN")
    for tool in ("apt-get", "apk ", "gcc", "build-essential", "pip ", "curl", "wget"):
        assert tool not in runs
    copies = [i.args for i in final_stage(dockerfile) if i.keyword == "COPY"]
    assert copies
    assert all(c.startswith("--from=") for c in copies)


def healthcheck_command(dockerfile: tuple[dict[str, str], list[list[Instruction]]]) -> list[str]:
    args = only(final_stage(dockerfile), "HEALTHCHECK").args
    _options, marker, command = args.partition("CMD ")
    assert marker, "HEALTHCHECK without CMD"
    return json.loads(command)  # type: ignore[no-any-return]


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[tuple[http.server.HTTPServer, type[_Health]]]:
    handler = type("Handler", (_Health,), {"status": 200})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, handler
    finally:
        server.shutdown()
        server.server_close()


def test_the_healthcheck_probes_healthz_without_curl(
    dockerfile: tuple[dict[str, str], list[list[Instruction]]],
    health_server: tuple[http.server.HTTPServer, type[_Health]],
) -> None:
    command = healthcheck_command(dockerfile)
    assert command[:2] == ["python", "-c"]
    code = command[2]
    assert f"127.0.0.1:{HEALTH_PORT}/healthz" in code
    # Run the probe as the image would, against a stand-in server on a free port.
    server, handler = health_server
    probe = [sys.executable, "-c", code.replace(f":{HEALTH_PORT}/", f":{server.server_port}/")]

    def exit_code() -> int:
        return subprocess.run(probe, capture_output=True, timeout=30, check=False).returncode

    assert exit_code() == 0
    handler.status = 503
    assert exit_code() == 1
    # Nothing listening: a bound socket that never listens refuses the connection.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        probe[2] = code.replace(f":{HEALTH_PORT}/", f":{closed.getsockname()[1]}/")
        assert exit_code() == 1


def test_the_build_context_leaves_out_local_state_and_tests() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "tests", "**/__pycache__", ".pytest_cache", ".mypy_cache"} <= ignored
    for needed in ("bridge", "consumers", "pyproject.toml", "README.md"):
        assert needed not in ignored


# -- Terraform --------------------------------------------------------------------------------


def test_terraform_is_formatted() -> None:
    terraform = shutil.which("terraform")
    if terraform is None:
        if os.environ.get("CI") == "true":
            pytest.fail("terraform is not installed, and CI=true requires this check")
        pytest.skip("terraform is not installed (with CI=true this is a failure)")
    result = subprocess.run(
        [terraform, "fmt", "-check", "-recursive", "-diff", str(TERRAFORM)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "CHECKPOINT_DISABLE": "1"},
    )
    assert result.returncode == 0, f"terraform fmt -check failed:\n{result.stdout}"


def hcl_strings(text: str, attribute: str) -> list[str]:
    """The quoted strings of a list attribute (`actions = [...]`), without an HCL parser."""
    lists = re.findall(rf"\b{attribute}\s*=\s*\[(.*?)\]", text, flags=re.DOTALL)
    return [s for block in lists for s in re.findall(r'"([^"]*)"', block)]


def test_the_sqs_policy_grants_only_what_the_bridge_calls() -> None:
    text = (TERRAFORM / "aws-sqs" / "main.tf").read_text(encoding="utf-8")
    assert sorted(hcl_strings(text, "actions")) == [
        "kms:Decrypt",
        "sqs:ChangeMessageVisibility",
        "sqs:DeleteMessage",
        "sqs:GetQueueAttributes",
        "sqs:ReceiveMessage",
    ]
    # The queue itself, and the queue's KMS key when there is one: no wildcard, no other queue.
    resources = re.findall(r"\bresources\s*=\s*\[(.*?)\]", text, flags=re.DOTALL)
    assert [r.strip() for r in resources] == ["aws_sqs_queue.this.arn", "statement.value"]
    assert re.search(r"maxReceiveCount\s*=\s*var\.max_receive_count", text)


def test_the_pubsub_subscription_is_exactly_once_with_a_dead_letter_topic() -> None:
    text = (TERRAFORM / "gcp-pubsub" / "main.tf").read_text(encoding="utf-8")
    assert re.search(r"enable_exactly_once_delivery\s*=\s*true", text)
    assert re.search(r"dead_letter_policy\s*\{", text)
    assert re.search(r"retry_policy\s*\{", text)
    roles = re.findall(r'role\s*=\s*"([^"]+)"', text)
    assert "roles/pubsub.subscriber" in roles
    assert not any(r in {"roles/owner", "roles/editor", "roles/pubsub.admin"} for r in roles)
    # The bridge's role binds to its subscription, never to the project.
    assert "google_project_iam" not in text
