# Packs one static binary into a one-layer OCI image-layout tarball that `ctr images import` loads
# under the name given (annotation io.containerd.image.name): the real test node's pause image.
# No registry, no builder: a gzip layer holding /pause, a config whose entrypoint is it, a manifest
# and index.json. Deterministic (mtime 0, sorted), so the same binary gives the same digests.
# Usage: python3 oci-image.py <binary> <image name> <out.tar>
import gzip, hashlib, io, json, sys, tarfile

binary, name, out = sys.argv[1:4]

def tar_bytes(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode='w', format=tarfile.PAX_FORMAT) as tar:
        for path, data, mode in entries:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime, info.uid, info.gid = len(data), mode, 0, 0, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()

with open(binary, 'rb') as f:
    layer_tar = tar_bytes([('pause', f.read(), 0o755)])
layer_gz = gzip.compress(layer_tar, mtime=0)
sha = lambda b: 'sha256:' + hashlib.sha256(b).hexdigest()
config = json.dumps({
    'architecture': 'amd64', 'os': 'linux',
    'config': {'Entrypoint': ['/pause'], 'User': '65535:65535'},
    'rootfs': {'type': 'layers', 'diff_ids': [sha(layer_tar)]},
}, sort_keys=True).encode()
manifest = json.dumps({
    'schemaVersion': 2, 'mediaType': 'application/vnd.oci.image.manifest.v1+json',
    'config': {'mediaType': 'application/vnd.oci.image.config.v1+json', 'digest': sha(config), 'size': len(config)},
    'layers': [{'mediaType': 'application/vnd.oci.image.layer.v1.tar+gzip', 'digest': sha(layer_gz), 'size': len(layer_gz)}],
}, sort_keys=True).encode()
index = json.dumps({
    'schemaVersion': 2, 'mediaType': 'application/vnd.oci.image.index.v1+json',
    'manifests': [{'mediaType': 'application/vnd.oci.image.manifest.v1+json', 'digest': sha(manifest), 'size': len(manifest),
                   'annotations': {'io.containerd.image.name': name, 'org.opencontainers.image.ref.name': name.rsplit(':', 1)[1]}}],
}, sort_keys=True).encode()
blobs = [(f'blobs/sha256/{sha(b)[7:]}', b, 0o644) for b in (layer_gz, config, manifest)]
with open(out, 'wb') as f:
    f.write(tar_bytes([('oci-layout', b'{"imageLayoutVersion":"1.0.0"}', 0o644), ('index.json', index, 0o644), *blobs]))
