"""vdet.tensorrt.build, vdet.tensorrt.plugin_library and `vdet engine` on a machine without
TensorRT.

What is tested here is vdet's own logic around TensorRT: which precision/typing a build uses on
10.x and 11.x, the optimization profile, the engine key of a request (computed from a given
TensorRT version and GPU name, which needs neither), how parser errors are reported, where the
plugin library is looked for, and what the CLI and the backend registry do when TensorRT is
absent. The TensorRT build itself runs only in tests/tensorrt/.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from support.engine_stand_ins import StandInBuilds, make_key

from vdet.cli.main import main
from vdet.core.assets import asset_path
from vdet.cuda.runtime import gpu_count
from vdet.inference.backends import create_backend, known_backends
from vdet.tensorrt.build import (
    BuildError,
    BuildOptions,
    EngineRequest,
    PrecisionPlan,
    engine_request,
    format_parser_errors,
    inspect_plan,
    onnx_precision,
    plan_precision,
    rect_profile_hw,
    resolve_profile,
    tensorrt_installed,
    tensorrt_version_tuple,
)
from vdet.tensorrt.cache import EngineCache, OptimizationProfile, manifest_path
from vdet.tensorrt.plugin_library import (
    LIBRARY_NAME,
    PluginLibraryError,
    candidate_paths,
    find_plugin_library,
    library_sha256,
    load_for_plan,
)
from vdet.tensorrt.surgery import DecodeNmsAttributes

DEMO = asset_path("demo.onnx")
HAVE_TENSORRT = tensorrt_installed()
A10 = ("NVIDIA A10", "8.6")


@pytest.fixture
def demo() -> Path:
    if not DEMO.is_file():
        pytest.skip("service/vdet/assets/demo.onnx is not present")
    return DEMO


# ---- precision ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("major", "requested", "carried", "expected"),
    [
        # TensorRT 10.x: weak typing unless the ONNX carries its precision.
        (10, "auto", "fp32", PrecisionPlan("fp32", strongly_typed=False)),
        (10, "fp32", "fp32", PrecisionPlan("fp32", strongly_typed=False)),
        (10, "fp16", "fp32", PrecisionPlan("fp16", strongly_typed=False, fp16_flag=True)),
        (10, "auto", "fp16", PrecisionPlan("fp16", strongly_typed=True)),
        (10, "fp16", "fp16", PrecisionPlan("fp16", strongly_typed=True)),
        (10, "auto", "int8", PrecisionPlan("int8", strongly_typed=True)),
        (10, "int8", "int8", PrecisionPlan("int8", strongly_typed=True)),
        # TensorRT 11.x: always strongly typed; fp16 of an fp32 ONNX is converted first.
        (11, "auto", "fp32", PrecisionPlan("fp32", strongly_typed=True)),
        (11, "fp16", "fp32", PrecisionPlan("fp16", strongly_typed=True, convert_fp16=True)),
        (11, "auto", "fp16", PrecisionPlan("fp16", strongly_typed=True)),
        (11, "int8", "int8", PrecisionPlan("int8", strongly_typed=True)),
    ],
)
def test_plan_precision(major: int, requested: str, carried: str, expected: PrecisionPlan) -> None:
    assert plan_precision(major, requested, carried) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("major", "requested", "carried", "match"),
    [
        (10, "int8", "fp32", "vdet quantize"),
        (11, "int8", "fp32", "no implicit INT8 calibration"),
        (10, "fp16", "int8", "quantized"),
        (11, "fp32", "int8", "quantized"),
        (11, "fp32", "fp16", "already computes in fp16"),
        (10, "bf16", "fp32", "precision must be one of"),
        (8, "auto", "fp32", "too old"),
    ],
)
def test_plan_precision_refusals(major: int, requested: str, carried: str, match: str) -> None:
    with pytest.raises(BuildError, match=match):
        plan_precision(major, requested, carried)  # type: ignore[arg-type]


def _tiny(nodes: list[onnx.NodeProto], out_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", out_type, [1, 4])],
        initializer=[
            helper.make_tensor("scale", TensorProto.FLOAT, [], [0.1]),
            helper.make_tensor("zero", TensorProto.INT8, [], [0]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_onnx_precision(demo: Path) -> None:
    assert onnx_precision(onnx.load(str(demo), load_external_data=False)) == "fp32"
    qdq = _tiny(
        [
            helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"]),
        ]
    )
    assert onnx_precision(qdq) == "int8"
    half = _tiny(
        [
            helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
            helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT),
        ]
    )
    assert onnx_precision(half) == "fp16"
    assert onnx_precision(_tiny([helper.make_node("Relu", ["x"], ["y"])])) == "fp32"


def test_versions_and_profiles() -> None:
    assert tensorrt_version_tuple("10.8.0.43") == (10, 8)
    assert tensorrt_version_tuple("11.1.0") == (11, 1)
    with pytest.raises(BuildError):
        tensorrt_version_tuple("ten")
    dynamic = OptimizationProfile(1, 4, 16)
    assert resolve_profile(None, dynamic) == dynamic
    assert resolve_profile(2, dynamic) == OptimizationProfile.fixed(2)


@pytest.mark.parametrize(
    ("input_hw", "stride", "expected"),
    [
        ((640, 640), 32, ((320, 320), (384, 640))),
        ((1280, 1280), 64, ((640, 640), (768, 1280))),
        ((480, 640), 32, ((256, 320), (384, 640))),
        ((24, 24), 32, None),  # smaller than the stride: no rect input
        ((640, 630), 32, None),
    ],
)
def test_rect_profile_covers_2_to_1_both_ways_tuned_for_16_9(
    input_hw: tuple[int, int],
    stride: int,
    expected: tuple[tuple[int, int], tuple[int, int]] | None,
) -> None:
    assert rect_profile_hw(input_hw, stride) == expected


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"precision": "fp8"}, "precision"),
        ({"optimization_level": 6}, "optimization level"),
        ({"workspace_mib": 0}, "workspace"),
    ],
)
def test_build_options_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(BuildError, match=match):
        BuildOptions(**kwargs)  # type: ignore[arg-type]


# ---- requests and keys --------------------------------------------------------------------------


def _request(
    source: Path, cache: Path, version: str = "10.8.0.43", **options: object
) -> EngineRequest:
    return engine_request(
        source,
        BuildOptions(**options),  # type: ignore[arg-type]
        cache,
        tensorrt_version=version,
        gpu=A10,
        lib="tensorrt",
    )


def test_request_key_for_the_demo_model(demo: Path, tmp_path: Path) -> None:
    request = _request(demo, tmp_path, profile=OptimizationProfile(1, 2, 4))
    key = request.key
    assert (key.gpu_name, key.compute_capability, key.tensorrt_version) == (*A10, "10.8.0.43")
    assert key.onnx_sha256 == request.info.sha256 and key.plugin_sha256 is None
    assert key.precision == "fp32" and not request.plan.strongly_typed
    # The demo's batch is dynamic, and so are its height and width: the profile covers the
    # rectangular inputs of the GPU path, tuned for 16:9.
    assert key.profile == OptimizationProfile(1, 2, 4, (320, 320), (384, 640))
    assert request.stem == "demo" and request.prepared_onnx == demo
    assert request.timing_cache == tmp_path / "timing.nvidia-a10-sm86.trt10.8.0.43.cache"
    meta = request.model_metadata()
    assert meta["input_hw"] == [640, 640] and len(meta["names"]) == 6

    fp16_10 = _request(demo, tmp_path, precision="fp16").plan
    fp16_11 = _request(demo, tmp_path, version="11.1.0", precision="fp16").plan
    assert fp16_10.fp16_flag and not fp16_10.convert_fp16
    assert fp16_11.convert_fp16 and fp16_11.strongly_typed and not fp16_11.fp16_flag
    with pytest.raises(BuildError, match="vdet quantize"):
        _request(demo, tmp_path, precision="int8")
    with pytest.raises(BuildError, match="too old"):
        _request(demo, tmp_path, version="10.7.0.23")


def test_request_with_the_plugin_keys_on_the_library(demo: Path, tmp_path: Path) -> None:
    library = tmp_path / "lib" / LIBRARY_NAME
    library.parent.mkdir()
    library.write_bytes(b"stand-in library bytes (never loaded here)")
    nms = DecodeNmsAttributes(max_det=100)
    request = _request(demo, tmp_path, plugin_nms=nms, plugin_library=library)
    assert request.stem == "demo.nms"
    assert request.key.plugin_sha256 == library_sha256(library)
    assert request.prepared_onnx.parent == tmp_path / "onnx" and request.prepared_onnx.is_file()
    assert request.key.onnx_sha256 != request.info.sha256  # the rewritten graph is what is built
    assert request.model_metadata()["plugin_nms"]["max_det"] == 100

    # The same request again reuses the rewritten ONNX; other attributes make another one.
    assert _request(demo, tmp_path, plugin_nms=nms, plugin_library=library).key == request.key
    other = _request(demo, tmp_path, plugin_nms=DecodeNmsAttributes(), plugin_library=library)
    assert other.key.onnx_sha256 != request.key.onnx_sha256

    # A rebuilt plugin library changes the key: its engines are refused and rebuilt.
    library.write_bytes(b"rebuilt library")
    assert _request(demo, tmp_path, plugin_nms=nms, plugin_library=library).key != request.key
    with pytest.raises(PluginLibraryError, match="cmake -S"):
        _request(demo, tmp_path, plugin_nms=nms, plugin_library=tmp_path / "missing.so")


# ---- parser errors ------------------------------------------------------------------------------


@dataclass
class RecordedParserError:
    """A stand-in with the accessors of TensorRT's ParserError, to test our formatting only."""

    node_index: int
    name: str
    operator: str
    description: str
    stack: list[str] = field(default_factory=list)

    def node(self) -> int:
        return self.node_index

    def node_name(self) -> str:
        return self.name

    def node_operator(self) -> str:
        return self.operator

    def desc(self) -> str:
        return self.description

    def code(self) -> str:
        return "ErrorCode.UNSUPPORTED_NODE"

    def file(self) -> str:
        return "onnxOpImporters.cpp"

    def line(self) -> int:
        return 6451

    def func(self) -> str:
        return "importFallbackPluginImporter"

    def local_function_stack(self) -> list[str]:
        return self.stack


def test_parser_errors_name_the_failing_nodes() -> None:
    lines = format_parser_errors(
        [
            RecordedParserError(
                321,
                "vdet/decode_nms",
                "VdetDecodeNms",
                "Plugin not found, are the plugin name, version, and namespace correct?",
            ),
            RecordedParserError(-1, "", "", "model has no graph"),
            RecordedParserError(7, "/m/Mul", "Mul", "bad", stack=["Attention", "Inner"]),
        ]
    )
    assert lines[0] == (
        "node 321 'vdet/decode_nms' (VdetDecodeNms): Plugin not found, are the plugin name, "
        "version, and namespace correct? [ErrorCode.UNSUPPORTED_NODE; onnxOpImporters.cpp:6451 "
        "importFallbackPluginImporter]"
    )
    assert lines[1].startswith("model: model has no graph")
    assert "in local function Attention > Inner" in lines[2]


# ---- plugin library -----------------------------------------------------------------------------


def test_plugin_library_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = tmp_path / "mine" / LIBRARY_NAME
    with pytest.raises(PluginLibraryError) as missing:
        find_plugin_library(explicit)
    message = str(missing.value)
    assert str(explicit) in message and "cmake -S" in message and "-DTensorRT_ROOT=" in message

    image_dir = tmp_path / "opt-vdet-lib"
    image_dir.mkdir()
    assert candidate_paths(image_dir)[0] == image_dir / LIBRARY_NAME
    (image_dir / LIBRARY_NAME).write_bytes(b"x")
    assert find_plugin_library(image_dir) == image_dir / LIBRARY_NAME  # a folder holding it
    explicit.parent.mkdir()
    explicit.write_bytes(b"y")
    assert find_plugin_library(explicit) == explicit
    if not any(p.is_file() for p in candidate_paths()):
        with pytest.raises(PluginLibraryError, match="Searched:"):
            find_plugin_library()


def test_a_plan_refuses_another_plugin_build(tmp_path: Path) -> None:
    """Checked before TensorRT is touched, so no TensorRT module is needed (None here)."""
    library = tmp_path / LIBRARY_NAME
    library.write_bytes(b"stand-in library rebuilt since the engine")
    with pytest.raises(PluginLibraryError, match="not the plugin library this engine was built"):
        load_for_plan(None, str(library), expected_sha256="0" * 64)


# ---- CLI and backend registry without TensorRT --------------------------------------------------


def test_engine_inspect_reports_a_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    builds = StandInBuilds()
    plan = EngineCache(tmp_path).get_or_build(make_key(), "demo", builds.write_stand_in_plan).plan
    rc = main(["engine", "inspect", str(plan)])
    report = json.loads(capsys.readouterr().out)
    assert report["manifest"]["key"]["gpu_name"] == "NVIDIA A10"
    assert report["manifest"]["build"]["builder"].startswith("stand-in")
    if not HAVE_TENSORRT:  # with TensorRT, inspect would also try to deserialize the stand-in
        assert rc == 0 and report["valid"] and "engine" not in report

    plan.write_bytes(b"tampered")
    assert main(["engine", "inspect", str(plan)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["valid"] and "bytes, the manifest says" in report["problem"]
    manifest_path(plan).unlink()
    assert main(["engine", "inspect", str(plan)]) == 1
    assert "no manifest" in json.loads(capsys.readouterr().out)["problem"]
    assert inspect_plan(plan)["valid"] is False


@pytest.mark.skipif(HAVE_TENSORRT, reason="checks the message where TensorRT is absent")
def test_engine_build_without_tensorrt(
    demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build = ["engine", "build", "--model", str(demo), "--cache-dir", str(tmp_path)]
    rc = main([*build, "--library", "tensorrt"])
    assert rc == 1
    assert "TensorRT's Python package is not installed" in capsys.readouterr().err
    assert main(["engine", "build", "--model", str(tmp_path / "none.onnx")]) == 2
    assert (
        main(["engine", "build", "--model", str(demo), "--min-batch", "4", "--max-batch", "2"]) == 2
    )


@pytest.mark.skipif(HAVE_TENSORRT and gpu_count() > 0, reason="checks a machine without TensorRT")
def test_registry_without_tensorrt(demo: Path) -> None:
    assert "tensorrt" in known_backends()
    with create_backend("auto", demo, threads=1) as backend:
        assert backend.name == "onnxruntime"  # tensorrt (300) is registered but not available
    with pytest.raises(RuntimeError, match="needs the tensorrt package and a GPU"):
        create_backend("tensorrt", demo)
