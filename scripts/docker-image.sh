#!/usr/bin/env bash
# Build Edward's default Docker sandbox image locally, with no registry:
# a busybox-static root filesystem imported with `docker import`.
#
#   scripts/docker-image.sh            # builds ${EDWARD_DOCKER_IMAGE:-edward-sandbox:busybox}
#
# The image has /bin/sh and the busybox applets (ls, cat, head, sleep, env,
# kill, mv, mkdir, ps, nc, ...), a `printenv` script, a non-root user
# `edward` (uid/gid 1000) whose home is /workspace, and /workspace owned by
# that user. It is tagged with a hash of this recipe (label
# `edward.image.recipe`): when an image of that name already carries the same
# hash, nothing is built, so repeated runs cost a `docker image inspect`.
#
# Needs a Docker daemon (scripts/dockerd.sh start). Installs busybox-static
# with apt-get when missing. For a production image (node, python, ...) see
# docker/Dockerfile and docs/DOCKER.md.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${EDWARD_DOCKER_IMAGE:-edward-sandbox:busybox}"
BASE="$(pwd)/target/docker-image"

log() { printf 'docker-image.sh: %s\n' "$*" >&2; }

if ! docker info >/dev/null 2>&1; then
    log "no Docker daemon answers; run scripts/dockerd.sh start first"
    exit 1
fi

if ! dpkg -s busybox-static >/dev/null 2>&1; then
    if [[ "$(id -u)" -ne 0 ]]; then
        log "busybox-static is not installed and we are not root to install it"
        exit 1
    fi
    log "installing busybox-static with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq busybox-static >&2
fi
BUSYBOX=/bin/busybox

# The recipe: this script plus the busybox binary it copies.
RECIPE="$( { cat "$0"; sha256sum <"$BUSYBOX"; } | sha256sum | cut -c1-16)"
if [[ "$(docker image inspect --format '{{ index .Config.Labels "edward.image.recipe" }}' \
    "$IMAGE" 2>/dev/null || true)" == "$RECIPE" ]]; then
    log "$IMAGE is up to date (recipe $RECIPE)"
    exit 0
fi

log "building $IMAGE (recipe $RECIPE)"
ROOTFS="$BASE/rootfs"
rm -rf "$ROOTFS"
mkdir -p "$ROOTFS"/{bin,etc,proc,sys,dev,tmp,root,workspace,usr}
cp "$BUSYBOX" "$ROOTFS/bin/busybox"
for applet in $("$BUSYBOX" --list); do
    [[ "$applet" == busybox ]] || ln -sf busybox "$ROOTFS/bin/$applet"
done
# Debian's busybox has no printenv applet; commands (and the conformance
# suite) expect one.
cat >"$ROOTFS/bin/printenv" <<'EOF'
#!/bin/sh
# printenv [NAME...]: print the environment, or the named variables' values.
if [ "$#" -eq 0 ]; then exec env; fi
exec awk 'BEGIN { s = 0; for (i = 1; i < ARGC; i++) { if (ARGV[i] in ENVIRON) print ENVIRON[ARGV[i]]; else s = 1 } exit s }' "$@"
EOF
chmod 0755 "$ROOTFS/bin/printenv"
ln -s ../bin "$ROOTFS/usr/bin"
ln -s bin "$ROOTFS/sbin"
ln -s ../bin "$ROOTFS/usr/sbin"
cat >"$ROOTFS/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
edward:x:1000:1000:edward:/workspace:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$ROOTFS/etc/group" <<'EOF'
root:x:0:
edward:x:1000:
nogroup:x:65534:
EOF
chmod 1777 "$ROOTFS/tmp"
chmod 0700 "$ROOTFS/root"
chown -R 0:0 "$ROOTFS"
chown 1000:1000 "$ROOTFS/workspace"
chmod 0755 "$ROOTFS/workspace"

tar -C "$ROOTFS" --numeric-owner -cf - . | docker import \
    --change "LABEL edward.image.recipe=$RECIPE" \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
    --change 'USER 1000:1000' \
    --change 'WORKDIR /workspace' \
    --change 'CMD ["/bin/sh"]' \
    - "$IMAGE" >/dev/null
log "built $IMAGE"
