//go:build !linux

package redistest

import "syscall"

// sysProcAttr returns nil: only Linux can kill the child with its parent.
func sysProcAttr() *syscall.SysProcAttr { return nil }
