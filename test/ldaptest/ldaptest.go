// Package ldaptest starts a throwaway OpenLDAP server (slapd) for tests:
// a child process of the test binary on 127.0.0.1 and a free port, with
// the ldif backend in a temporary directory, the suffix dc=example,dc=net
// and the entries tests add with AddUser (as the root DN, over LDAP). Tests
// skip when slapd is not installed (Debian: apt-get install slapd).
package ldaptest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/go-ldap/ldap/v3"
)

// BaseDN is the server's suffix; people are under ou=people of it.
const BaseDN = "dc=example,dc=net"

// RootDN and RootPassword are the server's administrator.
const (
	RootDN       = "cn=Manager," + BaseDN
	RootPassword = "ldap-root-secret"
)

// Server is a running slapd.
type Server struct {
	Host string
	Port int
	dir  string
}

// find returns slapd's path, or "".
func find() string {
	for _, p := range []string{"/usr/sbin/slapd", "/usr/local/libexec/slapd"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("slapd"); err == nil {
		return p
	}
	return ""
}

// schemaDir returns the directory of OpenLDAP's schema files.
func schemaDir() string {
	for _, d := range []string{"/etc/ldap/schema", "/etc/openldap/schema"} {
		if _, err := os.Stat(filepath.Join(d, "core.schema")); err == nil {
			return d
		}
	}
	return ""
}

// Start starts slapd for t (stopped with t's cleanup) with ou=people
// created, or skips t when slapd is not installed.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, schema := find(), schemaDir()
	if bin == "" || schema == "" {
		t.Skip("slapd is not installed (apt-get install slapd)")
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`include %[1]s/core.schema
include %[1]s/cosine.schema
include %[1]s/nis.schema
include %[1]s/inetorgperson.schema
pidfile %[2]s/slapd.pid
access to attrs=userPassword
        by anonymous auth
        by * none
access to *
        by * read
database ldif
directory %[3]s
suffix "%[4]s"
rootdn "%[5]s"
rootpw %[6]s
`, schema, dir, data, BaseDN, RootDN, RootPassword)
	file := filepath.Join(dir, "slapd.conf")
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		port := freePort(t)
		var out bytes.Buffer
		cmd := exec.Command(bin, "-f", file, "-h", fmt.Sprintf("ldap://127.0.0.1:%d/", port), "-d", "0")
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatalf("slapd: %v", err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		s := &Server{Host: "127.0.0.1", Port: port, dir: dir}
		if s.waitReady(exited) {
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-exited
			})
			s.add(t, &ldap.AddRequest{DN: BaseDN, Attributes: []ldap.Attribute{
				{Type: "objectClass", Vals: []string{"dcObject", "organization"}}, {Type: "o", Vals: []string{"example"}}, {Type: "dc", Vals: []string{"example"}}}})
			s.add(t, &ldap.AddRequest{DN: "ou=people," + BaseDN, Attributes: []ldap.Attribute{
				{Type: "objectClass", Vals: []string{"organizationalUnit"}}, {Type: "ou", Vals: []string{"people"}}}})
			return s
		}
		_ = cmd.Process.Kill()
		<-exited
		if attempt == 3 {
			t.Fatalf("slapd did not start:\n%s", out.String())
		}
	}
}

// waitReady waits until the server accepts connections (false if it
// exited or did not within 10 s).
func (s *Server) waitReady(exited <-chan struct{}) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case <-exited:
			return false
		default:
		}
		if c, err := net.Dial("tcp", s.Addr()); err == nil {
			c.Close()
			return true
		}
	}
	return false
}

// Addr is host:port.
func (s *Server) Addr() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// URL is the server's ldap:// URL.
func (s *Server) URL() string { return "ldap://" + s.Addr() }

// AddUser adds uid=<uid>,ou=people with password and mail.
func (s *Server) AddUser(t testing.TB, uid, password, mail string) {
	t.Helper()
	s.add(t, &ldap.AddRequest{DN: "uid=" + uid + ",ou=people," + BaseDN, Attributes: []ldap.Attribute{
		{Type: "objectClass", Vals: []string{"inetOrgPerson"}}, {Type: "uid", Vals: []string{uid}},
		{Type: "cn", Vals: []string{uid}}, {Type: "sn", Vals: []string{uid}},
		{Type: "mail", Vals: []string{mail}}, {Type: "userPassword", Vals: []string{password}}}})
}

func (s *Server) add(t testing.TB, req *ldap.AddRequest) {
	t.Helper()
	c, err := ldap.DialURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Bind(RootDN, RootPassword); err != nil {
		t.Fatal(err)
	}
	if err := c.Add(req); err != nil {
		t.Fatalf("add %s: %v", req.DN, err)
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
