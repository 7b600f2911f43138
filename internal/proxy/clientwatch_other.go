//go:build !linux

package proxy

// canWatch is false: elsewhere than on Linux a rate-limit wait does not
// watch its client (the wait still ends with its session and at its
// max_wait).
const canWatch = false

func peerGone(uintptr) bool { return false }
