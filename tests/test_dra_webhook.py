"""The webhook's DRA path: an extender-mode pod in, a ResourceClaimTemplate and patch out
(pure), the namespace rule, and the Admission's answers with a fake API (no I/O here: the
real control plane runs it in tests/test_dra_webhook_e2e.py)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from _core_helpers import MLU
from _jsonpatch import apply_patch
from hypothesis import given, settings
from hypothesis import strategies as st

from hami import config
from hami.core.requests import RequestError
from hami.kube.raw import KubeError
from hami.scheduler import dramutate
from hami.scheduler.admission import Admission
from hami.scheduler.devicemode import DeviceModeError, mode_of
from hami.scheduler.role import device_kinds
from hami.scheduler.webhook import PodDenied

KINDS = device_kinds(config.from_mapping({}, env={}))
DRIVER = "nvidia.hami.io"
#: every request of the webhook's keeps off MIG partitions (a HAMi-core share is asked)
NO_PARTITION = {"cel": {"expression": f'!has(device.attributes["{DRIVER}"].migProfile)'}}


def pod(
    *containers: dict[str, Any],
    annotations: dict[str, str] | None = None,
    init: tuple[dict[str, Any], ...] = (),
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init:
        body["initContainers"] = list(init)
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def container(name: str = "c", **limits: str) -> dict[str, Any]:
    named = {f"nvidia.com/{k}": v for k, v in limits.items()}
    return {"name": name, "image": "busybox", "resources": {"limits": named}}


def convert(p: dict[str, Any], sizes: dict[str, list[int]] | None = None) -> dramutate.Conversion:
    out = dramutate.convert(p, KINDS, "hami-scheduler", sizes=sizes)
    assert out is not None, "the pod asks for a device"
    return out


def requests_of(conversion: dramutate.Conversion) -> list[dict[str, Any]]:
    return list(conversion.template["spec"]["spec"]["devices"]["requests"])


# ---------------------------------------------------------------- conversion


def test_one_gpu_2000_mib_30_cores() -> None:
    p = pod(container(gpu="1", gpumem="2000", gpucores="30"))
    out = convert(p)
    assert requests_of(out) == [
        {
            "name": "c",
            "exactly": {
                "deviceClassName": DRIVER,
                "capacity": {"requests": {"memory": "2000Mi", "cores": "30"}},
                "selectors": [NO_PARTITION],
            },
        }
    ]
    assert "constraints" not in out.template["spec"]["spec"]["devices"]
    patched = apply_patch(p, out.ops)
    spec = patched["spec"]
    assert spec["resourceClaims"] == [
        {"name": "hami", "resourceClaimTemplateName": out.template_name}
    ]
    assert spec["schedulerName"] == "hami-scheduler"
    assert spec["containers"][0]["resources"] == {
        "limits": {},
        "claims": [{"name": "hami", "request": "c"}],
    }
    assert out.template_name.startswith("hami-")
    assert out.template["metadata"]["labels"] == {"hami.io/generated-by": "webhook"}


def test_the_same_shape_names_the_same_template() -> None:
    a = convert(pod(container(gpu="1", gpumem="2000")))
    b = convert(pod(container(gpu="1", gpumem="2000"), annotations={"x": "y"}))
    c = convert(pod(container(gpu="1", gpumem="2001")))
    assert a.template_name == b.template_name != c.template_name


def test_count_only_asks_the_whole_device_and_all_cores() -> None:
    # as the extender webhook fills in: a count without memory or cores is exclusive
    out = convert(pod(container(gpu="2")))
    (request,) = requests_of(out)
    assert request["exactly"] == {
        "deviceClassName": DRIVER,
        "allocationMode": "ExactCount",
        "count": 2,
        "capacity": {"requests": {"cores": "100"}},
        "selectors": [NO_PARTITION],
    }
    assert out.template["spec"]["spec"]["devices"]["constraints"] == [
        {"requests": ["c"], "distinctAttribute": f"{DRIVER}/uuid"}
    ]


def test_memory_only_gets_the_default_count() -> None:
    (request,) = requests_of(convert(pod(container(gpumem="3000"))))
    assert "count" not in request["exactly"]
    assert request["exactly"]["capacity"]["requests"] == {"memory": "3000Mi", "cores": "0"}


def test_percentage_100_is_the_whole_device() -> None:
    (request,) = requests_of(convert(pod(container(gpu="1", **{"gpumem-percentage": "100"}))))
    assert request["exactly"]["capacity"]["requests"] == {"cores": "100"}


def test_percentage_is_one_alternative_per_published_size() -> None:
    p = pod(container(gpu="1", gpucores="20", **{"gpumem-percentage": "50"}))
    assert dramutate.percent_types(p, KINDS) == {"nvidia"}
    (request,) = requests_of(convert(p, {"nvidia": [40960, 15360, 40960]}))
    assert "exactly" not in request
    subs = request["firstAvailable"]
    assert [s["name"] for s in subs] == ["m0", "m1"]
    assert [s["capacity"]["requests"] for s in subs] == [
        {"memory": "7680Mi", "cores": "20"},
        {"memory": "20480Mi", "cores": "20"},
    ]
    assert subs[0]["selectors"] == [
        NO_PARTITION,
        {
            "cel": {
                "expression": f'device.capacity["{DRIVER}"].memory.compareTo('
                'quantity("15360Mi")) == 0'
            }
        },
    ]


def test_percentage_without_any_published_size_is_refused() -> None:
    p = pod(container(gpu="1", **{"gpumem-percentage": "50"}))
    with pytest.raises(dramutate.Unsupported, match=r"pod ns/p container 'c'.*gpumem in MiB"):
        convert(p, {})


def test_percentage_with_too_many_sizes_is_refused() -> None:
    p = pod(container(gpu="1", **{"gpumem-percentage": "50"}))
    with pytest.raises(dramutate.Unsupported, match="9 sizes, at most 8"):
        convert(p, {"nvidia": [1000 * (i + 1) for i in range(9)]})


def test_selectors_become_cel_and_numa_a_constraint() -> None:
    annotations = {
        "nvidia.com/use-gputype": "A100",
        "nvidia.com/nouse-gputype": "T4,V100",
        "nvidia.com/use-gpuuuid": "GPU-b,GPU-a",
        "nvidia.com/nouse-gpuuuid": "GPU-x",
        "nvidia.com/numa-bind": "true",
    }
    out = convert(pod(container(gpu="2", gpumem="1000"), annotations=annotations))
    (request,) = requests_of(out)
    model = f'device.attributes["{DRIVER}"].model.lowerAscii()'
    uuid = f'device.attributes["{DRIVER}"].uuid'
    assert [s["cel"]["expression"] for s in request["exactly"]["selectors"]] == [
        f'{model}.contains("a100")',
        f'!{model}.contains("t4")',
        f'!{model}.contains("v100")',
        f'{uuid} in ["GPU-a", "GPU-b"]',
        f'!({uuid} in ["GPU-x"])',
        NO_PARTITION["cel"]["expression"],
    ]
    assert out.template["spec"]["spec"]["devices"]["constraints"] == [
        {"requests": ["c"], "distinctAttribute": f"{DRIVER}/uuid"},
        {"requests": ["c"], "matchAttribute": f"{DRIVER}/numa"},
    ]


def test_several_use_types_are_one_or() -> None:
    out = convert(pod(container(gpu="1"), annotations={"nvidia.com/use-gputype": "A100,H100"}))
    (request,) = requests_of(out)
    selector, no_partition = request["exactly"]["selectors"]
    assert no_partition == NO_PARTITION
    assert " || " in selector["cel"]["expression"]
    assert '"a100"' in selector["cel"]["expression"]
    assert '"h100"' in selector["cel"]["expression"]


@pytest.mark.parametrize("value", ['A100")||true||("', "x\\y", "é", "a" * 200])
def test_selector_values_cannot_write_cel(value: str) -> None:
    p = pod(container(gpu="1"), annotations={"nvidia.com/use-gputype": value})
    with pytest.raises(RequestError, match=r"pod ns/p: annotation nvidia.com/use-gputype"):
        convert(p)


def test_priority_becomes_env_and_leaves_the_limits() -> None:
    c = container(gpu="1", gpumem="1000", priority="1")
    c["env"] = [{"name": "A", "value": "b"}]
    c["resources"]["requests"] = {"nvidia.com/gpu": "1", "cpu": "1"}
    p = pod(c)
    patched = apply_patch(p, convert(p).ops)["spec"]["containers"][0]
    assert patched["env"] == [
        {"name": "A", "value": "b"},
        {"name": "CUDA_TASK_PRIORITY", "value": "1"},
    ]
    assert patched["resources"]["limits"] == {}
    assert patched["resources"]["requests"] == {"cpu": "1"}


def test_one_request_per_container_init_too_and_cpu_containers_untouched() -> None:
    p = pod(
        container("a", gpu="1", gpumem="1000"),
        {"name": "cpu", "image": "busybox"},
        container("b", gpumem="500", gpucores="10"),
        init=(container("prep", gpu="1", gpumem="100"),),
        resourceClaims=[{"name": "nic", "resourceClaimName": "rdma"}],
    )
    out = convert(p)
    assert [r["name"] for r in requests_of(out)] == ["prep", "a", "b"]
    spec = apply_patch(p, out.ops)["spec"]
    assert spec["resourceClaims"][0] == {"name": "nic", "resourceClaimName": "rdma"}
    assert spec["resourceClaims"][1]["name"] == "hami"
    assert spec["initContainers"][0]["resources"]["claims"] == [{"name": "hami", "request": "prep"}]
    assert spec["containers"][0]["resources"]["claims"] == [{"name": "hami", "request": "a"}]
    assert spec["containers"][1] == {"name": "cpu", "image": "busybox"}
    assert spec["containers"][2]["resources"]["claims"] == [{"name": "hami", "request": "b"}]


def test_two_types_name_requests_by_type() -> None:
    c = container("c", gpu="1", gpumem="100")
    c["resources"]["limits"]["cambricon.com/vmlu"] = "1"
    out = dramutate.convert(pod(c), [*KINDS, MLU], "hami-scheduler")
    assert out is not None
    assert [r["name"] for r in requests_of(out)] == ["c-nvidia", "c-mlu"]
    assert [r["exactly"]["deviceClassName"] for r in requests_of(out)] == [
        DRIVER,
        "mlu.hami.io",
    ]


def test_forged_decisions_are_removed_and_policies_warned() -> None:
    p = pod(
        container(gpu="1"),
        annotations={
            "hami.io/vgpu-node": "n1",
            "hami.io/node-scheduler-policy": "spread",
        },
    )
    out = convert(p)
    patched = apply_patch(p, out.ops)
    assert "hami.io/vgpu-node" not in patched["metadata"]["annotations"]
    assert out.warnings and "hami.io/node-scheduler-policy" in out.warnings[0]


@pytest.mark.parametrize(
    ("p", "error", "match"),
    [
        (pod(container(gpu="x")), RequestError, "container 'c': nvidia.com/gpu"),
        (pod(container(gpu="1", gpucores="101")), RequestError, "between 0 and 100"),
        (
            pod(container(gpu="1", **{"gpumem-percentage": "0"})),
            RequestError,
            "between 1 and 100",
        ),
        (pod(container(gpu="1"), nodeName="n1"), PodDenied, "spec.nodeName=n1"),
        (
            pod(container(gpu="1"), resourceClaims=[{"name": "hami", "resourceClaimName": "x"}]),
            dramutate.Unsupported,
            "already names a resource claim 'hami'",
        ),
        (pod(container(gpu="1"), resourceClaims="x"), RequestError, "not a list"),
        (
            pod(container(gpu="1"), annotations={"nvidia.com/vgpu-mode": "mig"}),
            dramutate.Unsupported,
            "vgpu-mode 'mig'",
        ),
        (
            pod(container("c" * 60, gpu="1"), container("d", **{"gpu": "1"})),
            None,
            "",
        ),
    ],
)
def test_invalid_requests_are_refused_naming_the_pod(
    p: dict[str, Any], error: type[Exception] | None, match: str
) -> None:
    if error is None:
        convert(p)  # a long container name alone is fine
        return
    with pytest.raises(error, match=match) as caught:
        convert(p)
    assert "ns/p" in str(caught.value)


def test_long_name_with_two_types_is_refused() -> None:
    c = container("c" * 60, gpu="1")
    c["resources"]["limits"]["cambricon.com/vmlu"] = "1"
    with pytest.raises(dramutate.Unsupported, match="shorten the container's name"):
        dramutate.convert(pod(c), [*KINDS, MLU], "hami-scheduler")


def test_kinds_with_own_rules_are_refused() -> None:
    ascend = [k for k in device_kinds(_all_backends()) if k.request_rule is not None]
    assert ascend, "a backend with its own request rules"
    kind = ascend[0]
    c = {"name": "c", "resources": {"limits": {kind.resources.count: "1"}}}
    with pytest.raises(dramutate.Unsupported, match=r"no DRA form.*hami.io/device-mode=extender"):
        dramutate.convert(pod(c), [kind], "hami-scheduler")


def _all_backends() -> config.Config:
    return config.from_mapping(
        {"backends": {"Ascend910B4": {"enabled": True}, "nvidia": {"enabled": True}}}, env={}
    )


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/priority"]
        ),
        st.one_of(st.integers(-5, 200).map(str), st.text(max_size=6), st.none(), st.integers()),
    ),
    st.dictionaries(
        st.sampled_from(["nvidia.com/use-gputype", "nvidia.com/use-gpuuuid", "x"]),
        st.text(max_size=8),
    ),
)
def test_junk_never_crashes(limits: dict[str, Any], annotations: dict[str, str]) -> None:
    """Any limits and selector annotations: refused naming the pod, or a patch that leaves
    no HAMi resource in the container and names a request of the template."""
    p = pod({"name": "c", "resources": {"limits": limits}}, annotations=annotations)
    try:
        out = dramutate.convert(p, KINDS, "hami-scheduler", sizes={"nvidia": [1000]})
    except (RequestError, PodDenied) as exc:
        assert "ns/p" in str(exc)
        return
    if out is None:
        return  # no device after all: the extender path's answer
    resources = apply_patch(p, out.ops)["spec"]["containers"][0]["resources"]
    assert not any(k.startswith("nvidia.com/") for k in resources.get("limits", {}))
    (request,) = requests_of(out)
    assert resources["claims"] == [{"name": "hami", "request": request["name"]}]


# ---------------------------------------------------------------- the namespace rule


def test_mode_of_namespace() -> None:
    assert mode_of("a", {}, "extender") == "extender"
    assert mode_of("a", {}, "dra") == "dra"
    assert mode_of("a", {"hami.io/device-mode": "dra"}, "extender") == "dra"
    assert mode_of("a", {"hami.io/device-mode": "extender"}, "dra") == "extender"
    with pytest.raises(DeviceModeError, match=r"namespace a has hami.io/device-mode='DRA'"):
        mode_of("a", {"hami.io/device-mode": "DRA"}, "extender")


def test_config_refuses_an_unknown_default_mode() -> None:
    with pytest.raises(config.ConfigError, match=r"scheduler\.webhook\.device_mode"):
        config.from_mapping({"scheduler": {"webhook": {"device_mode": "both"}}}, env={})


# ---------------------------------------------------------------- Admission with a fake API


class FakeKube:
    """The three calls Admission makes, answered from memory."""

    def __init__(self, labels: dict[str, dict[str, str]]) -> None:
        self.labels = labels
        self.created: list[tuple[str, dict[str, Any]]] = []
        self.gets = 0
        self.fail_create = False

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.gets += 1
        name = path.rsplit("/", 1)[-1]
        if name not in self.labels:
            raise KubeError(403, "Forbidden", "no", path)
        return {"metadata": {"name": name, "labels": self.labels[name]}}

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.fail_create:
            raise KubeError(403, "Forbidden", "cannot create", path)
        if any(b["metadata"]["name"] == body["metadata"]["name"] for _, b in self.created):
            raise KubeError(409, "AlreadyExists", "exists", path)
        self.created.append((path, body))
        return body

    async def list_all(self, path: str, **_: Any) -> tuple[list[dict[str, Any]], str]:
        return [], ""


def review_body(p: dict[str, Any], namespace: str = "ns", dry_run: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": namespace,
            "dryRun": dry_run,
            "object": p,
        },
    }


def admission(kube: FakeKube, default: str = "extender") -> Admission:
    return Admission(kube, KINDS, "hami-scheduler", default_mode=default)  # type: ignore[arg-type]


def ops_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    assert answer["response"]["allowed"] is True, answer
    return list(json.loads(base64.b64decode(answer["response"]["patch"])))


async def test_admission_routes_by_namespace_label() -> None:
    kube = FakeKube({"ns": {"hami.io/device-mode": "dra"}, "plain": {}})
    hook = admission(kube)
    p = pod(container(gpu="1", gpumem="2000", gpucores="30"))
    dra = ops_of(await hook.review(review_body(p)))
    assert any(op["path"] == "/spec/resourceClaims" for op in dra)
    (path, template) = kube.created[0]
    assert path == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaimtemplates"
    assert template["spec"]["spec"]["devices"]["requests"][0]["name"] == "c"
    # the extender namespace: the extender path's patch, nothing created
    plain = ops_of(await hook.review(review_body(p, "plain")))
    assert not any("resourceClaims" in op["path"] for op in plain)
    assert len(kube.created) == 1
    # a second pod of the same shape: the template exists (409), admitted all the same
    again = ops_of(await hook.review(review_body(p)))
    assert again == dra


async def test_admission_default_mode_dry_run_and_cache() -> None:
    kube = FakeKube({"ns": {}})
    hook = admission(kube, default="dra")
    p = pod(container(gpu="1"))
    ops_of(await hook.review(review_body(p, dry_run=True)))
    assert kube.created == []  # sideEffects NoneOnDryRun
    ops_of(await hook.review(review_body(p)))
    assert len(kube.created) == 1
    assert kube.gets == 1  # the namespace's labels are cached a few seconds


async def test_admission_refusals_name_pod_and_fix() -> None:
    kube = FakeKube({"ns": {"hami.io/device-mode": "dra"}, "bad": {"hami.io/device-mode": "x"}})
    hook = admission(kube)
    answer = await hook.review(review_body(pod(container(gpu="1"), nodeName="n")))
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 403
    answer = await hook.review(review_body(pod(container(gpu="1", **{"gpumem-percentage": "5"}))))
    assert answer["response"]["status"]["code"] == 400
    assert "pod ns/p" in answer["response"]["status"]["message"]
    answer = await hook.review(review_body(pod(container(gpu="1")), "bad"))
    assert "label it hami.io/device-mode=extender" in answer["response"]["status"]["message"]
    answer = await hook.review(review_body(pod(container(gpu="1")), "unreadable"))
    assert answer["response"]["status"]["code"] == 500
    assert "cannot read namespace unreadable" in answer["response"]["status"]["message"]
    kube.fail_create = True
    answer = await hook.review(review_body(pod(container(gpu="1", gpumem="7"))))
    assert answer["response"]["allowed"] is False
    assert "cannot create ResourceClaimTemplate ns/hami-" in answer["response"]["status"]["message"]


def test_a_count_of_zero_or_a_priority_alone_is_no_claim() -> None:
    assert dramutate.convert(pod(container(gpu="0")), KINDS, "s") is None
    assert dramutate.convert(pod(container(priority="1")), KINDS, "s") is None


async def test_admission_gives_a_pod_without_a_device_the_extender_answer() -> None:
    kube = FakeKube({"ns": {"hami.io/device-mode": "dra"}})
    hook = admission(kube)
    answer = await hook.review(review_body(pod(container(gpu="0"))))
    assert answer["response"]["allowed"] is True
    assert not any("resourceClaims" in op["path"] for op in ops_of(answer))
    assert kube.created == []


async def test_admission_leaves_pods_without_devices_alone() -> None:
    kube = FakeKube({})
    hook = admission(kube, default="dra")
    answer = await hook.review(review_body(pod({"name": "c", "image": "x"})))
    assert answer["response"]["allowed"] is True
    assert "patch" not in answer["response"]
    assert kube.gets == 0  # no namespace read for a pod that asks no device
    other = pod(container(gpu="1"), schedulerName="volcano")
    assert "patch" not in (await hook.review(review_body(other)))["response"]


def test_the_score_and_explain_read_the_webhooks_type_selectors() -> None:
    """hami.dra.podrequest (the DRA score, hami explain) reads the type selectors the
    webhook writes, so a converted pod is weighed and explained with its use-gputype."""
    from hami.dra.podrequest import reads_selector

    annotations = {"nvidia.com/use-gputype": "T4", "nvidia.com/nouse-gputype": "A10"}
    out = convert(pod(container(gpu="1"), annotations=annotations))
    (request,) = requests_of(out)
    expressions = [s["cel"]["expression"] for s in request["exactly"]["selectors"]]
    assert expressions and all(reads_selector(e, DRIVER) for e in expressions)
