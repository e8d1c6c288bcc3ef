#!/bin/bash
# Packs the RTSP test camera (tests/support/rtsp_server.py) with everything it runs on, taken
# from this Debian machine: its Python 3.11, PyGObject, GStreamer with the RTSP server and the
# plugins the camera uses, their libraries down to the C library and the dynamic loader. A GPU
# host without GStreamer (or with another Python) unpacks it anywhere and runs the camera with
# the packed loader, so none of the host's own libraries is used:
#
#     bash bench/gpu/pack_rtsp_camera.sh OUT.tar.xz        # here (needs .ci/system-packages.txt)
#     tar -xJf OUT.tar.xz -C /opt                           # there: /opt/rtsp-camera/python3
#     VDET_RTSP_CAMERA_PYTHON=/opt/rtsp-camera/python3 pytest -m gpu ...
#
# `python3` in the folder is a wrapper that starts the packed interpreter through the packed
# loader with the packed libraries, typelibs and plugins only.
set -euo pipefail

out=${1:?usage: pack_rtsp_camera.sh OUT.tar.xz}
arch=x86_64-linux-gnu
lib=/usr/lib/$arch
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/rtsp-camera
mkdir -p "$root"/{bin,lib,lib/gstreamer-1.0,lib/girepository-1.0,lib/python3/dist-packages}

cp /usr/bin/python3.11 "$root/bin/"
# The standard library without the packages a headless camera never imports, and of the
# extension modules only those it may (the rest, such as _ssl, would bring OpenSSL along).
skip=(test idlelib tkinter ensurepip lib2to3 pydoc_data 'config-3.11-*' distutils turtledemo
    site-packages dist-packages email xml multiprocessing asyncio unittest sqlite3 curses dbm
    concurrent http urllib wsgiref xmlrpc venv lib-dynload)
tar -C /usr/lib -cf - "${skip[@]/#/--exclude=python3.11/}" --exclude='__pycache__' python3.11 |
    tar -C "$root/lib" -xf -
mkdir -p "$root/lib/python3.11/lib-dynload"
for ext in _contextvars _json _queue _typing mmap resource termios; do
    cp /usr/lib/python3.11/lib-dynload/$ext.cpython-311-$arch.so "$root/lib/python3.11/lib-dynload/"
done
cp -r /usr/lib/python3/dist-packages/gi "$root/lib/python3/dist-packages/"
find "$root/lib" -name __pycache__ -prune -exec rm -rf {} +

plugins=(coreelements app isomp4 matroska videoparsersbad rtp rtpmanager udp)
for name in "${plugins[@]}"; do
    cp "$lib/gstreamer-1.0/libgst$name.so" "$root/lib/gstreamer-1.0/"
done
for typelib in GLib-2.0 GObject-2.0 GModule-2.0 Gio-2.0 Gst-1.0 GstBase-1.0 GstApp-1.0 \
    GstNet-1.0 GstRtsp-1.0 GstSdp-1.0 GstRtp-1.0 GstRtspServer-1.0; do
    cp "$lib/girepository-1.0/$typelib.typelib" "$root/lib/girepository-1.0/"
done

# Every shared library these need (the typelibs' own libraries are loaded by name at run
# time, so they are named here), resolved by this machine's loader.
roots=("$root/bin/python3.11" "$root"/lib/gstreamer-1.0/*.so
    "$root"/lib/python3/dist-packages/gi/*.so "$root"/lib/python3.11/lib-dynload/*.so
    "$lib"/libgstrtspserver-1.0.so.0 "$lib"/libgstapp-1.0.so.0 "$lib"/libgstnet-1.0.so.0
    "$lib"/libgirepository-1.0.so.1)
ldd "${roots[@]}" 2>/dev/null | awk '/=> \//{print $3} /^\t\/lib64\//{print $1}' | sort -u |
    while read -r so; do
        cp -L "$so" "$root/lib/"
    done
cp "$lib"/libgstrtspserver-1.0.so.0 "$lib"/libgstapp-1.0.so.0 "$lib"/libgstnet-1.0.so.0 \
    "$lib"/libgirepository-1.0.so.1 "$root/lib/"
cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib/"

cat >"$root/python3" <<'EOF'
#!/bin/sh
# The packed Python 3.11 with PyGObject and GStreamer: nothing of the host's libraries used.
here=$(dirname "$(readlink -f "$0")")
export PYTHONHOME="$here" PYTHONPATH="$here/lib/python3/dist-packages" PYTHONNOUSERSITE=1
export GI_TYPELIB_PATH="$here/lib/girepository-1.0"
export GST_PLUGIN_SYSTEM_PATH="$here/lib/gstreamer-1.0" GST_PLUGIN_PATH=""
export GST_REGISTRY="${TMPDIR:-/tmp}/rtsp-camera-registry.bin" GST_REGISTRY_FORK=no
export GIO_MODULE_DIR="$here/lib/gio-modules"
exec "$here/lib/ld-linux-x86-64.so.2" --library-path "$here/lib" "$here/bin/python3.11" "$@"
EOF
chmod +x "$root/python3"
mkdir -p "$root/lib/gio-modules"
tar -C "$stage" -cJf "$out" rtsp-camera
echo "$out: $(du -h "$out" | cut -f1), $(find "$root" -type f | wc -l) files"
