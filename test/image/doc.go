// Package image tests the container images `make image` builds (meshid, the
// CA and the tools, and meshid-agent, the lean agent; deploy/image/) through
// the real Docker engine:
//
//   - what is in them: the static binary, CA certificates, passwd and group
//     with the nonroot user 65532, nsswitch.conf, /tmp and the nonroot home;
//     no shell; the OCI annotations from git;
//   - that they run as 65532 with --read-only --cap-drop ALL
//     --security-opt no-new-privileges;
//   - `meshid dev` in a container, its state directory bind-mounted from the
//     host and its CA port published on 127.0.0.1: `meshid inspect --sds` on
//     the host reads its SDS socket through the mount, a host `meshid-agent`
//     gets a certificate from it, and the agent image alone does too;
//   - that .dockerignore keeps keys, state directories and caches out of the
//     build context;
//   - the image sizes (logged; the figures are in docs/benchmarks.md).
//
// The tests carry the build tag "image" and need images built for them:
// `make test-image` builds them under a tag of its own and runs
// `go test -tags image` with MESHID_IMAGE, MESHID_AGENT_IMAGE (the images),
// MESHID_IMAGE_BIN (the directory of the same static binaries, which the
// host side of the tests runs) and MESHID_IMAGE_REMOVE=1 (remove the images
// when done). Without them, or without a Docker engine, the tests skip, but
// fail under CI=true. Every container and image a test creates has a name of
// its own run and is removed when the test ends.
package image
