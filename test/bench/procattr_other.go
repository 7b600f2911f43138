//go:build !linux

package main

import "syscall"

// sysProcAttr puts a child in its own process group; cred, when not nil,
// runs it as another OS user. (The harness reads /proc and is meant for
// Linux; this only keeps the package compiling elsewhere.)
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}
