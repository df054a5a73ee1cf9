# launcher gpu image. Built by `launcher build gpu` with the classic builder:
#  - LAUNCHER_BASE is filled from lockfiles/images.lock (a digest, never a tag);
#  - wheels/ and lock.txt come from lockfiles/gpu.txt, downloaded and hash-checked on the host;
#  - pip installs offline, every wheel checked against its locked sha256;
#  - SOURCE_DATE_EPOCH makes compiled bytecode hash-based, so it carries no build time.
ARG LAUNCHER_BASE
FROM ${LAUNCHER_BASE} AS venv
ARG SOURCE_DATE_EPOCH
COPY lock.txt /tmp/lock.txt
COPY wheels/ /tmp/wheels/
RUN python3 -m venv --without-pip /opt/venv \
 && set -- /tmp/wheels/pip-*.whl \
 && python3 "$1/pip" --python /opt/venv/bin/python install \
      --no-index --find-links /tmp/wheels --require-hashes --no-deps --no-cache-dir \
      --disable-pip-version-check --root-user-action=ignore -r /tmp/lock.txt

FROM ${LAUNCHER_BASE}
# Runs of this variant need a GPU on the host (launcher checks before shipping, docker run --gpus all).
LABEL launcher.accelerator="gpu"
COPY --from=venv /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONPATH=/opt/launcher \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TF_CPP_MIN_LOG_LEVEL=1
WORKDIR /launcher
COPY lock.txt /opt/launcher/lock.txt
COPY launcher/ /opt/launcher/launcher/
# Bytecode compiled here once, hash-based (no build time in it), for the runtime and for the standard
# library, whose cached bytecode records source mtimes the base's normalised files no longer have:
# without it every interpreter a run starts compiles each module it imports again (PYTHONDONTWRITEBYTECODE).
RUN python -m compileall -q --invalidation-mode checked-hash /opt/launcher/launcher \
      "$(python -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')"
# No recipes here: launcher adds them itself as the image's last layer, so a recipe edit
# rebuilds and ships that small layer alone (see README, Build and rebuild).
CMD ["python", "-m", "launcher.runtime", "--help"]
