# shellcheck shell=sh
# Runs on the host (sh -c TEXT sh STAGE EMPTIES MANIFEST NAMES), sent as text by
# transfers.shipstaged.send_compressed: in the staging folder STAGE, where the layers the host lacked
# arrived as gzip blobs, make an empty file for each layer the host has (EMPTIES), write the image
# config (read from stdin) and MANIFEST, and feed them with the layers (NAMES, in order) as one
# archive to `docker load`, which skips a layer it already has and gunzips the others.
# EMPTIES and NAMES are space-separated file names (NNN.empty, NNN.tar.gz): split on purpose.
# shellcheck disable=SC2086
cd "$1" && for f in $2; do : > "$f"; done && cat > config.json && printf %s "$3" > manifest.json \
  && tar -cf - config.json manifest.json $4 | docker load -q
