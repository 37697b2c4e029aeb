"""An S3-compatible object store on this machine: SeaweedFS (Apache 2.0),
built from the Go module proxy and run as `weed mini` (master, volume,
filer and S3 gateway in one process), on loopback with free ports. What the
object-store test tier runs the tables on (docs/deploy.md).

Why SeaweedFS: MinIO is under the AGPL; SeaweedFS builds here from the Go
module proxy (about 4 minutes on 2 cores the first time) and its S3 gateway
honours conditional writes (`If-None-Match: *`), which delta-rs's commits
rely on for put-if-absent on S3."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import conf
from taproot_ops.embedded import free_port, python_under, stop_popen

if TYPE_CHECKING:
    import pyarrow.fs

SEAWEEDFS_MODULE = "github.com/seaweedfs/seaweedfs"
# The release the Go module proxy serves as a pseudo-version (it tags
# releases without a go.mod-compatible version).
SEAWEEDFS_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
ACCESS_KEY, SECRET_KEY = "taproot-test", "taproot-test-secret"
# Ports in a network namespace of its own (SeaweedFS's defaults; the master's
# gRPC port is its port + 10000, the volume's and filer's likewise).
S3_PORT = 8333
NAMESPACE_PORTS = (9333, 8080, 8888, 23646, 6060)


GRPC_OFFSET = 10000   # SeaweedFS reserves each server's port + this for its gRPC


class ObjectStoreError(RuntimeError):
    pass


def _free_ports(count: int, taken: set[int]) -> list[int]:
    """`count` free loopback ports for SeaweedFS's servers, each with its
    gRPC port (port + GRPC_OFFSET) free too, and none of them another's:
    `weed mini` refuses a port that is another server's gRPC port (a
    flake of the suite when two free ports happened to be 10,000 apart)."""
    ports: list[int] = []
    taken = set(taken)
    while len(ports) < count:
        port = free_port()
        grpc = port + GRPC_OFFSET
        if grpc > 65535 or port in taken or grpc in taken or not _bindable(grpc):
            continue
        ports.append(port)
        taken.update((port, grpc))
    return ports


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def weed_binary() -> Path:
    """Where the built `weed` is kept: outside any checkout, so clones share it."""
    base = Path(os.environ.get("TAPROOT_TOOLS_DIR") or Path.home() / ".cache" / "taproot" / "tools")
    return base / f"weed-{SEAWEEDFS_VERSION[-12:]}"


def build_weed(say: bool = True) -> Path:
    """Build SeaweedFS's `weed` once (`go mod download`, then `go build` in a
    copy of the module: its go.mod has replace directives, which `go install
    module@version` refuses)."""
    binary = weed_binary()
    if binary.exists():
        return binary
    if shutil.which("go") is None:
        raise ObjectStoreError("building SeaweedFS needs the Go toolchain (`go`) on the PATH")
    if say:
        print(f"building SeaweedFS {SEAWEEDFS_VERSION} (the S3 server of the object-store tests) from the Go "
              "module proxy: about 4 minutes on 2 cores, once", flush=True)
    work = binary.parent / "seaweedfs-src"
    try:
        out = subprocess.run(["go", "mod", "download", "-json", f"{SEAWEEDFS_MODULE}@{SEAWEEDFS_VERSION}"],
                             capture_output=True, text=True, check=True, timeout=900)
        import json
        source = json.loads(out.stdout)["Dir"]
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(source, work)
        for path in work.rglob("*"):                 # the module cache is read-only
            path.chmod(path.stat().st_mode | 0o200)
        work.chmod(work.stat().st_mode | 0o200)
        tmp = binary.with_suffix(".tmp")
        subprocess.run(["go", "build", "-o", str(tmp), "./weed"], cwd=work, check=True, timeout=2400,
                       capture_output=True, text=True)
        tmp.replace(binary)
    except subprocess.CalledProcessError as exc:
        raise ObjectStoreError(f"building SeaweedFS failed: {(exc.stderr or '')[-2000:]}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return binary


class SeaweedFS:
    """`weed mini` with one bucket, credentials ACCESS_KEY/SECRET_KEY (the
    S3 gateway checks signatures). A context manager; `env` is what a
    process needs to reach it (the AWS_* variables delta-rs and s3a read)."""

    def __init__(self, directory: str | Path, bucket: str = "taproot", *, host: str = "127.0.0.1",
                 launch_prefix: Sequence[str] = ()):
        """`host`: the address it serves on (loopback by default);
        `launch_prefix`: a command its process runs under (`ip netns exec
        NS`: another network namespace, whose ports are its own)."""
        self.directory = Path(directory)
        self.bucket = bucket
        self.host = host
        self.launch_prefix = list(launch_prefix)
        self.s3_port = free_port() if not self.launch_prefix else S3_PORT
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.s3_port}"

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}

    @property
    def storage(self) -> conf.StorageConfig:
        """`[storage]` for this server."""
        return conf.StorageConfig(endpoint=self.endpoint, allow_http=True)

    def use_in_this_process(self) -> None:
        """This process's delta-rs reaches the server: its credentials and
        `[storage]`'s variables in the environment."""
        os.environ.update(self.env)
        os.environ.update(self.storage.delta_rs_env())

    def start(self, timeout_s: float = 60) -> "SeaweedFS":
        binary = build_weed()
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        names = ("master.port", "volume.port", "filer.port", "admin.port", "debug.port")
        # In a namespace of its own every port is free; here, any free ones.
        ports = (dict(zip(names, NAMESPACE_PORTS)) if self.launch_prefix
                 else dict(zip(names, _free_ports(len(names), taken={self.s3_port, self.s3_port + GRPC_OFFSET}))))
        args = [*self.launch_prefix, str(binary), "mini", f"-dir={data}", f"-ip={self.host}", f"-ip.bind={self.host}",
                f"-s3.port={self.s3_port}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-admin.ui=false",
                "-admin.port.legacy=0", "-webdav=false",
                *(f"-{name}={port}" for name, port in ports.items())]
        with open(self.directory / "weed.log", "ab") as log:
            # The credentials in its environment become the store's first identity.
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=dict(os.environ, **self.env), start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ObjectStoreError(f"SeaweedFS exited with {self.process.returncode}; see "
                                       f"{self.directory / 'weed.log'}")
            try:
                self._ensure_bucket()   # signed requests, as delta-rs and s3a make them
                return self
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise ObjectStoreError(f"SeaweedFS did not serve within {timeout_s:.0f} s; see {self.directory / 'weed.log'}")

    def filesystem(self) -> "pyarrow.fs.S3FileSystem":
        return filesystem(self.endpoint)

    def _ensure_bucket(self) -> None:
        if not self.launch_prefix:
            ensure_bucket(self.endpoint, self.bucket)
            return
        # Reachable only from inside its namespace: ask from there.
        python_under(self.launch_prefix, "import sys; from taproot_ops.object_store import ensure_bucket; "
                     "ensure_bucket(sys.argv[1], sys.argv[2])", self.endpoint, self.bucket)

    def stop(self) -> None:
        if self.process is not None:
            stop_popen(self.process, 15)
        self.process = None

    def __enter__(self) -> "SeaweedFS":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def filesystem(endpoint: str) -> "pyarrow.fs.S3FileSystem":
    """pyarrow's S3 client for the server at `endpoint`, with its credentials."""
    from pyarrow import fs
    return fs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region="us-east-1",
                           endpoint_override=endpoint.removeprefix("http://"), scheme="http",
                           allow_bucket_creation=True)


def ensure_bucket(endpoint: str, bucket: str) -> None:
    """Create `bucket` unless it exists (signed requests, as delta-rs and s3a make them)."""
    from pyarrow import fs
    store = filesystem(endpoint)
    if store.get_file_info(bucket).type == fs.FileType.NotFound:
        store.create_dir(bucket)


def main() -> None:
    """`python -m taproot_ops.object_store` (`make test`): build SeaweedFS's
    `weed` if it is not built yet, saying so, and where it is."""
    try:
        had = weed_binary().exists()
        binary = build_weed()
    except ObjectStoreError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"SeaweedFS for the object-store tests: {binary}" + ("" if had else " (built)"), flush=True)


if __name__ == "__main__":
    main()
