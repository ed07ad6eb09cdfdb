#!/usr/bin/env bash
# Builds Tandem's container images from deploy/docker/Dockerfile.cpu and Dockerfile.gpu with
# docker (BuildKit, through the buildx plugin) or podman, whichever is installed and working, and
# pushes them when asked.
#
#   deploy/docker/build.sh [--cpu] [--gpu] [--registry REGISTRY] [--name NAME] [--tag TAG]
#                          [--push] [--engine docker|podman] [--pin-digests]
#                          [--build-arg NAME=VALUE]...
#
#   --cpu, --gpu     the images to build (default: both)
#   --registry R     prefix of the image names, e.g. registry.example.com/ml (default: none)
#   --name NAME      image repository name (default: tandem)
#   --tag TAG        tag (default: the project version in CMakeLists.txt); the images are
#                    [R/]NAME:TAG-cpu and [R/]NAME:TAG-gpu
#   --push           push each image after it is built (needs --registry and a login)
#   --engine E       use docker or podman (default: the first of them that works)
#   --pin-digests    resolve the Debian base images' tags to digests now and build from those
#                    digests (printed), so that a rebuild uses the same bases
#   --build-arg A=V  passed on to the build (e.g. CUDA_VERSION=13.0, DEBIAN_SLIM_IMAGE=...)
#
# The model is never part of an image: mount it at /models (see deploy/docker/entrypoint.sh).
# Exit status: 0 when every image was built (and pushed); 1 when a build or push failed; 2 for
# bad arguments; 3 when no container engine can build here (none installed, or its daemon is
# not reachable).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DOCKER_DIR="$ROOT/deploy/docker"

say() { printf '[build] %s\n' "$*"; }
die() {
  local status=$1
  shift
  printf '[build] FAILED: %s\n' "$1" >&2
  shift
  local line
  for line in "$@"; do printf '[build]   %s\n' "$line" >&2; done
  exit "$status"
}
# The comment at the top of this file.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

variants=()
registry=""
name="tandem"
tag=""
push=0
engine=""
pin_digests=0
build_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) variants+=(cpu) ;;
    --gpu) variants+=(gpu) ;;
    --registry) [ $# -ge 2 ] || die 2 "--registry needs a value"; registry="${2%/}"; shift ;;
    --registry=*) registry="${1#*=}"; registry="${registry%/}" ;;
    --name) [ $# -ge 2 ] || die 2 "--name needs a value"; name="$2"; shift ;;
    --name=*) name="${1#*=}" ;;
    --tag) [ $# -ge 2 ] || die 2 "--tag needs a value"; tag="$2"; shift ;;
    --tag=*) tag="${1#*=}" ;;
    --push) push=1 ;;
    --engine) [ $# -ge 2 ] || die 2 "--engine needs a value"; engine="$2"; shift ;;
    --engine=*) engine="${1#*=}" ;;
    --pin-digests) pin_digests=1 ;;
    --build-arg) [ $# -ge 2 ] || die 2 "--build-arg needs NAME=VALUE"; build_args+=("$2"); shift ;;
    --build-arg=*) build_args+=("${1#*=}") ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die 2 "unknown argument: $1" ;;
  esac
  shift
done
[ ${#variants[@]} -gt 0 ] || variants=(cpu gpu)
case "$engine" in
  "" | docker | podman) ;;
  *) die 2 "--engine must be docker or podman, not '$engine'" ;;
esac
if [ -z "$tag" ]; then
  tag="$(sed -n 's/^project(tandem VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")"
  [ -n "$tag" ] || die 2 "no --tag given and no project version found in $ROOT/CMakeLists.txt"
fi
if [ "$push" -eq 1 ] && [ -z "$registry" ]; then
  die 2 "--push needs --registry (where to push the images)"
fi
for arg in "${build_args[@]+"${build_args[@]}"}"; do
  case "$arg" in
    [A-Za-z_]*=*) ;;
    *) die 2 "--build-arg takes NAME=VALUE, not '$arg'" ;;
  esac
done

# Why `candidate` cannot build here, or nothing when it can.
engine_problem() {
  local candidate=$1 out
  if ! command -v "$candidate" >/dev/null 2>&1; then
    echo "$candidate is not installed"
    return
  fi
  if ! out="$("$candidate" info 2>&1 >/dev/null)"; then
    echo "$candidate is installed but cannot reach its daemon or storage: ${out:-"$candidate info" failed}"
    return
  fi
  if [ "$candidate" = docker ] && ! docker buildx version >/dev/null 2>&1; then
    echo "docker has no buildx plugin: the Dockerfiles need BuildKit (RUN --mount); install docker-buildx"
  fi
}

pick_engine() {
  local candidates=(docker podman) problems=() candidate problem
  [ -z "$engine" ] || candidates=("$engine")
  for candidate in "${candidates[@]}"; do
    problem="$(engine_problem "$candidate")"
    if [ -z "$problem" ]; then
      engine=$candidate
      return
    fi
    problems+=("$problem")
  done
  die 3 "no container engine can build the images here" "${problems[@]}" \
    "install Docker (with the buildx plugin) or Podman, start the Docker daemon (or set DOCKER_HOST)," \
    "or build elsewhere: the build needs the Debian and NVIDIA package repositories and Docker Hub"
}

# The digest reference of `image` (debian:12.12-slim -> debian:12.12-slim@sha256:...).
resolve_digest() {
  local image=$1 digest=""
  if [ "$engine" = docker ]; then
    digest="$(docker buildx imagetools inspect "$image" | sed -n 's/^Digest: *//p' | head -n 1)"
  else
    podman pull -q "$image" >/dev/null
    digest="$(podman image inspect --format '{{.Digest}}' "$image")"
  fi
  [ -n "$digest" ] || die 1 "could not resolve the digest of $image"
  printf '%s@%s\n' "${image%@*}" "$digest"
}

# The default value of `ARG name=value` in a Dockerfile.
dockerfile_arg() {
  sed -n "s/^ARG $2=//p" "$1" | head -n 1
}

pick_engine
say "engine: $engine"
revision="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
failed=0
for variant in "${variants[@]}"; do
  dockerfile="$DOCKER_DIR/Dockerfile.$variant"
  image="${registry:+$registry/}$name:$tag-$variant"
  args=(-f "$dockerfile" -t "$image"
        --label "org.opencontainers.image.version=$tag"
        --label "org.opencontainers.image.revision=$revision")
  [ "$variant" = cpu ] || args+=(--platform linux/amd64)
  if [ "$pin_digests" -eq 1 ]; then
    for base in DEBIAN_IMAGE DEBIAN_SLIM_IMAGE; do
      pinned="$(resolve_digest "$(dockerfile_arg "$dockerfile" "$base")")"
      say "$variant: $base=$pinned"
      args+=(--build-arg "$base=$pinned")
    done
  fi
  for arg in "${build_args[@]+"${build_args[@]}"}"; do args+=(--build-arg "$arg"); done
  say "building $image from ${dockerfile#"$ROOT"/}"
  if [ "$engine" = docker ]; then
    build=(docker buildx build --load "${args[@]}" "$ROOT")
  else
    build=(podman build "${args[@]}" "$ROOT")
  fi
  if ! "${build[@]}"; then
    say "$image: the build failed (see above)"
    failed=1
    continue
  fi
  if [ "$push" -eq 1 ]; then
    say "pushing $image"
    if ! "$engine" push "$image"; then
      say "$image: the push failed (see above; is '$engine login ${registry%%/*}' done?)"
      failed=1
      continue
    fi
  fi
  say "$image: done"
done
exit "$failed"
