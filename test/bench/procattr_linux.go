package main

import "syscall"

// sysProcAttr puts a child in its own process group (so that stopping it
// also stops anything it started) and makes the kernel kill it when the
// harness dies, so that a crashed or killed harness leaves nothing behind.
// cred, when not nil, runs the child as another OS user.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
}
