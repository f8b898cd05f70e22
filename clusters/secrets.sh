#!/usr/bin/env bash
# Prints the Secrets a worker cluster needs before its pods can start, and the ApiKey object that
# makes the router's admin key valid, as YAML for `kubectl apply -f -`:
#
#   clusters/secrets.sh | kubectl apply -f -
#
# - Secret asb-cluster-secret (cluster.secret): 32 random bytes, the key of every sandbox access
#   token (src/worker/access-token.ts); all worker-api replicas share it.
# - Secret asb-admin-key (key): an admin API key, asb_<8>_<32> of [a-z0-9] as src/auth/keys.ts
#   makes them, which the router uses to read the worker API's route feed.
# - ApiKey <prefix> (asb.dev/v1alpha1): that key's SHA-256, the only form the system stores.
#
# Run it once per cluster: running it again makes new ones (every access token changes).
# Needs bash, coreutils (head, tr, base64, sha256sum). Namespace: $1, default agent-sandbox-system.
set -euo pipefail
namespace="${1:-agent-sandbox-system}"

random_chars() { LC_ALL=C tr -dc 'a-z0-9' </dev/urandom | head -c "$1" || true; }

prefix="$(random_chars 8)"
key="asb_${prefix}_$(random_chars 32)"
hash="$(printf '%s' "$key" | sha256sum | cut -d' ' -f1)"
secret="$(head -c 32 /dev/urandom | base64 | tr -d '\n')"

cat <<YAML
apiVersion: v1
kind: Secret
metadata:
  name: asb-cluster-secret
  namespace: ${namespace}
type: Opaque
data:
  cluster.secret: ${secret}
---
apiVersion: v1
kind: Secret
metadata:
  name: asb-admin-key
  namespace: ${namespace}
type: Opaque
stringData:
  key: ${key}
---
apiVersion: asb.dev/v1alpha1
kind: ApiKey
metadata:
  name: ${prefix}
  labels:
    asb.dev/team: admin
spec:
  team: admin
  hash: ${hash}
  prefix: asb_${prefix}
  admin: true
  revoked: false
  description: router admin key (clusters/secrets.sh)
YAML
echo "clusters/secrets.sh: admin key asb_${prefix}_… is in Secret ${namespace}/asb-admin-key" >&2
