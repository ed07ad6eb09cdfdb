"""The tandem.v1 Python modules, generated from proto/tandem/v1/*.proto at test time with
grpcio-tools into a temporary folder. Shared by the interop test and the cluster tests."""
import importlib
import pathlib
import subprocess
import sys
import tempfile


class GeneratedProtos:
    """The Python modules generated from the protos under `root` (kept alive with their temporary
    folder): .inference, .worker, .inference_grpc, .worker_grpc."""

    def __init__(self, root):
        root = pathlib.Path(root)
        protos = sorted(str(p.relative_to(root)) for p in root.glob("tandem/v1/*.proto"))
        assert protos, f"no .proto files under {root}/tandem/v1"
        try:
            import grpc_tools  # noqa: F401  (only to fail with a clear message)
        except ImportError as error:
            raise AssertionError(
                f"grpc_tools is not installed for {sys.executable} ({error}); install the test "
                "requirements (grpcio-tools, protobuf, pytest) into the project's .venv"
            ) from error

        self._folder = tempfile.TemporaryDirectory(prefix="tandem_proto_py_")
        out = pathlib.Path(self._folder.name)
        command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{root}",
                   f"--python_out={out}", f"--grpc_python_out={out}", *protos]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stderr}"
        # Regular packages, so that no other "tandem" on sys.path can shadow these modules.
        for package in (out / "tandem", out / "tandem" / "v1"):
            (package / "__init__.py").touch()
        for name in list(sys.modules):
            if name == "tandem" or name.startswith("tandem."):
                del sys.modules[name]
        sys.path.insert(0, str(out))
        importlib.invalidate_caches()
        try:
            self.inference = importlib.import_module("tandem.v1.inference_pb2")
            self.worker = importlib.import_module("tandem.v1.worker_pb2")
            self.inference_grpc = importlib.import_module("tandem.v1.inference_pb2_grpc")
            self.worker_grpc = importlib.import_module("tandem.v1.worker_pb2_grpc")
        finally:
            sys.path.remove(str(out))
        assert pathlib.Path(self.inference.__file__).is_relative_to(out), self.inference.__file__
