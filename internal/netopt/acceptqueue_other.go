//go:build !linux

package netopt

import "net"

// AcceptQueued is 0 where TCP_INFO does not tell a listener's accept queue.
func AcceptQueued(net.Listener) int { return 0 }
