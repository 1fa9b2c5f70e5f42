#!/bin/sh
# The runtime image's root: what distroless/cc-debian12 holds, made from
# Debian 12's own .debs by `cargo xtask image` (xtask/src/image.rs).
#
# `runtime-root.sh hook ROOT`, an mmdebstrap extract hook:
# `mmdebstrap --variant=extract` has unpacked
# the packages asked for and their hard dependencies, with no maintainer
# script run. This keeps the files of the packages named in
# NODE_AGENT_KEEP only (the dependencies, such as mawk, debconf and openssl,
# are there for package scripts that never run in the image), writes the
# CA bundle update-ca-certificates would write, the users the manifests run
# as, and each kept package's control fields where scanners read them
# (/var/lib/dpkg/status.d/, as distroless does). No shell, no dpkg, no apt.
#
# `runtime-root.sh finish ROOT`, once mmdebstrap is done: removes what
# mmdebstrap itself leaves (its apt and dpkg state, device nodes, the
# host's resolv.conf and hostname: the runtime provides those).
set -eu
step="$1"
root="$2"
cd "$root"
if [ "$step" = finish ]; then
	rm -rf etc/apt etc/dpkg/dpkg.cfg.d etc/resolv.conf etc/hostname var/lib/apt var/cache/apt \
		var/cache/debconf var/log/apt usr/sbin/update-ca-certificates dev/* usr/share/perl5
	find var/lib/dpkg -mindepth 1 -maxdepth 1 ! -name status.d -exec rm -rf {} +
	# Of the kept packages' own files, the ones nothing in the image can
	# run or read: the motd script of base-files, manual pages, and every
	# document but the copyright files (kept, as distroless keeps them).
	rm -rf etc/update-motd.d usr/share/man usr/share/info usr/share/lintian
	find usr/share/doc -mindepth 1 ! -type d ! -name copyright -exec rm -f {} +
	find usr/share/doc -mindepth 1 -type d -empty -delete
	exit 0
fi
keep=" ${NODE_AGENT_KEEP:?names of the packages to keep} "
for deb in var/cache/apt/archives/*.deb; do
	pkg=$(dpkg-deb -f "$deb" Package)
	case "$keep" in
	*" $pkg "*)
		mkdir -p var/lib/dpkg/status.d
		{
			dpkg-deb -f "$deb" Package Version Architecture Source Maintainer
			echo "Status: install ok installed"
		} >"var/lib/dpkg/status.d/$pkg"
		;;
	*)
		# Regular files and symlinks only: directories may be shared.
		dpkg-deb --fsys-tarfile "$deb" | tar -t | while IFS= read -r f; do
			f=${f#./}
			if [ -L "$f" ] || [ -f "$f" ]; then rm -f "$f"; fi
		done
		;;
	esac
done

# update-ca-certificates' bundle: every certificate of the Mozilla set, in
# name order (ca-certificates' default configuration enables them all).
if [ -d usr/share/ca-certificates/mozilla ]; then
	mkdir -p etc/ssl/certs
	find usr/share/ca-certificates/mozilla -name '*.crt' | LC_ALL=C sort | while IFS= read -r c; do
		cat "$c"
	done >etc/ssl/certs/ca-certificates.crt
fi

# The users: root for the agent (it reads root-only tracefs), nonroot
# (65532, distroless's) for the controller, nobody.
cat >etc/passwd <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >etc/group <<'EOF'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
EOF
mkdir -p root home/nonroot tmp
chmod 0700 root home/nonroot
chown 65532:65532 home/nonroot
chmod 1777 tmp

