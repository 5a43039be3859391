#!/usr/bin/env python3
"""Makes an OCI image tarball from one binary, without Docker.

    oci-image.py --binary PATH --name REF --output FILE.tar
                 [--path /controller] [--user 65532] [--env K=V ...]

The tarball is an OCI image layout (oci-layout, index.json, blobs/sha256/...)
with one manifest, one config and one gzipped layer holding a minimal root
file system: the binary at --path (the entrypoint), /etc/passwd and
/etc/group with root and a `nonroot` user (uid and gid --user), /tmp
(mode 1777), and, when the binary is dynamically linked, the shared libraries
and the loader that `ldd` lists, at the same paths. Import it with
`ctr -n k8s.io images import FILE.tar`; the image is named REF (annotation
io.containerd.image.name). The output is byte-for-byte reproducible for the
same inputs (fixed mtimes, owners and order).
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile

MTIME = 0


def shared_libraries(binary):
    """The absolute paths `ldd` resolves for a dynamic binary ([] if static)."""
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        sys.exit("oci-image.py: ldd not found (needed to check whether the binary is static)")
    text = out.stdout + out.stderr
    if "not a dynamic executable" in text or "statically linked" in text:
        return []
    if out.returncode != 0:
        sys.exit(f"oci-image.py: ldd {binary} failed: {text.strip()}")
    libs = []
    for line in out.stdout.splitlines():
        if "not found" in line:
            sys.exit(f"oci-image.py: {binary}: a library is missing: {line.strip()}")
        m = re.search(r"=>\s*(/\S+)", line) or re.match(r"\s*(/\S+)", line)
        if m:
            libs.append(m.group(1))
    return sorted(set(libs))


def add_dir(tar, path, mode=0o755):
    info = tarfile.TarInfo(path.lstrip("/"))
    info.type = tarfile.DIRTYPE
    info.mode = mode
    info.mtime = MTIME
    tar.addfile(info)


def add_bytes(tar, path, data, mode=0o644):
    info = tarfile.TarInfo(path.lstrip("/"))
    info.size = len(data)
    info.mode = mode
    info.mtime = MTIME
    tar.addfile(info, io.BytesIO(data))


def add_file(tar, path, source, mode=None):
    with open(source, "rb") as f:
        data = f.read()
    if mode is None:
        mode = os.stat(source).st_mode & 0o777
    add_bytes(tar, path, data, mode)


def layer(binary, path, user, libs):
    files = {}  # path in the image -> (source or bytes, mode)
    files[path] = (binary, 0o755)
    files["/etc/passwd"] = (
        f"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{user}:{user}:nonroot:/home/nonroot:/sbin/nologin\n".encode(),
        0o644,
    )
    files["/etc/group"] = (f"root:x:0:\nnonroot:x:{user}:\n".encode(), 0o644)
    for lib in libs:
        # The real file, at the path the binary asks for (symlinks resolved).
        files[lib] = (os.path.realpath(lib), 0o755)
    dirs = {"/tmp": 0o1777, "/home/nonroot": 0o755, "/etc": 0o755}
    for p in files:
        d = os.path.dirname(p)
        while d not in ("/", ""):
            dirs.setdefault(d, 0o755)
            d = os.path.dirname(d)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(dirs):
            add_dir(tar, d, dirs[d])
        for p in sorted(files):
            src, mode = files[p]
            if isinstance(src, bytes):
                add_bytes(tar, p, src, mode)
            else:
                add_file(tar, p, src, mode)
    return raw.getvalue()


def blob(out, data):
    digest = hashlib.sha256(data).hexdigest()
    add_bytes(out, f"blobs/sha256/{digest}", data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", required=True, help="the program (static, or dynamic: its libraries are copied)")
    ap.add_argument("--name", required=True, help="image reference, e.g. registry.k8s.io/pause:3.10.1")
    ap.add_argument("--output", required=True, help="the tarball to write")
    ap.add_argument("--path", default=None, help="where the binary goes in the image (default /<its name>)")
    ap.add_argument("--user", type=int, default=65532, help="uid and gid of the image's user (default 65532)")
    ap.add_argument("--env", action="append", default=[], help="K=V for the image config (repeatable)")
    args = ap.parse_args()

    if not os.access(args.binary, os.X_OK):
        sys.exit(f"oci-image.py: {args.binary} is not an executable file")
    path = args.path or "/" + os.path.basename(args.binary)
    libs = shared_libraries(args.binary)
    raw = layer(args.binary, path, args.user, libs)
    gz = gzip.compress(raw, compresslevel=6, mtime=MTIME)

    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": f"{args.user}:{args.user}",
            "Entrypoint": [path],
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"] + args.env,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]},
        "history": [{"created_by": f"oci-image.py {os.path.basename(args.binary)}"}],
    }
    tag = args.name.rsplit(":", 1)[1] if ":" in args.name.rsplit("/", 1)[-1] else "latest"
    with open(args.output, "wb") as f, tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as out:
        add_bytes(out, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        add_dir(out, "blobs")
        add_dir(out, "blobs/sha256")
        config_desc = blob(out, json.dumps(config, sort_keys=True).encode())
        layer_desc = blob(out, gz)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer_desc}],
        }
        manifest_desc = blob(out, json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    **manifest_desc,
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": args.name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
        add_bytes(out, "index.json", json.dumps(index, sort_keys=True).encode())
    kind = f"dynamic, {len(libs)} libraries copied" if libs else "static"
    print(
        f"oci-image.py: {args.output}: {args.name} ({kind}; layer {len(gz)} bytes, manifest {manifest_desc['digest']})",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
