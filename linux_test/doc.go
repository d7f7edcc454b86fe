// Package linux_test holds tests that need the real Linux kernel and often root: what the storage
// tier does without io_uring, and (as they are written) on slow, hung, failing or full filesystems,
// after crashes, and with several processes at once; and on real filesystems: two clients of a
// GlusterFS volume as two hosts, XFS and ext4 on loop devices, tmpfs. Each test skips with its reason
// when the machine lacks a capability (not root, no /dev/fuse, a missing package, glusterd not
// running); on CI, which has them all, none may skip.
//
// Helpers live in other packages: internal/faultfs mounts a fault-injecting FUSE filesystem, the
// subpackage noring re-runs the test binary in a child process without io_uring; fsys_linux_test.go
// sets up and tears down the real filesystems. Because of noring,
// this package's TestMain calls noring.InstallFilterFromEnv before anything else.
package linux_test
