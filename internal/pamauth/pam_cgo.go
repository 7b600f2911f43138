//go:build cgo && linux

package pamauth

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// The Linux-PAM ABI (security/pam_appl.h), declared here so that poolerd
// builds without libpam's headers.
struct pam_message { int msg_style; const char *msg; };
struct pam_response { char *resp; int resp_retcode; };
struct pam_conv {
	int (*conv)(int, const struct pam_message **, struct pam_response **, void *);
	void *appdata_ptr;
};
typedef struct pam_handle pam_handle_t;
enum {
	P_SUCCESS = 0, P_BUF_ERR = 5, P_CONV_ERR = 19,
	P_PROMPT_ECHO_OFF = 1, P_PROMPT_ECHO_ON = 2, P_ERROR_MSG = 3, P_TEXT_INFO = 4,
	P_RHOST = 4, P_MAX_NUM_MSG = 32,
};
#define P_SILENT 0x8000

typedef struct {
	void *h;
	int (*start)(const char *, const char *, const struct pam_conv *, pam_handle_t **);
	int (*authenticate)(pam_handle_t *, int);
	int (*acct_mgmt)(pam_handle_t *, int);
	int (*end)(pam_handle_t *, int);
	int (*set_item)(pam_handle_t *, int, const void *);
	const char *(*strerror)(pam_handle_t *, int);
} poolerd_pam;

// poolerd_pam_open loads libpam; NULL (with dlerror's text in err) if it
// cannot.
static poolerd_pam *poolerd_pam_open(char *err, size_t errlen) {
	void *h = dlopen("libpam.so.0", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		strncpy(err, e ? e : "dlopen failed", errlen - 1);
		err[errlen - 1] = 0;
		return NULL;
	}
	poolerd_pam *p = calloc(1, sizeof(poolerd_pam));
	if (!p) {
		dlclose(h);
		strncpy(err, "out of memory", errlen - 1);
		return NULL;
	}
	p->h = h;
	p->start = dlsym(h, "pam_start");
	p->authenticate = dlsym(h, "pam_authenticate");
	p->acct_mgmt = dlsym(h, "pam_acct_mgmt");
	p->end = dlsym(h, "pam_end");
	p->set_item = dlsym(h, "pam_set_item");
	p->strerror = dlsym(h, "pam_strerror");
	if (!p->start || !p->authenticate || !p->acct_mgmt || !p->end || !p->set_item || !p->strerror) {
		strncpy(err, "libpam.so.0 lacks a PAM function", errlen - 1);
		err[errlen - 1] = 0;
		dlclose(h);
		free(p);
		return NULL;
	}
	return p;
}

// poolerd_pam_close unloads libpam (loaded once per open).
static void poolerd_pam_close(poolerd_pam *p) {
	dlclose(p->h);
	free(p);
}

// poolerd_pam_conv answers every prompt with the password (appdata).
static int poolerd_pam_conv(int n, const struct pam_message **msg, struct pam_response **resp, void *appdata) {
	if (n <= 0 || n > P_MAX_NUM_MSG)
		return P_CONV_ERR;
	struct pam_response *r = calloc(n, sizeof(struct pam_response));
	if (!r)
		return P_BUF_ERR;
	for (int i = 0; i < n; i++) {
		switch (msg[i]->msg_style) {
		case P_PROMPT_ECHO_OFF:
		case P_PROMPT_ECHO_ON:
			r[i].resp = strdup((const char *)appdata);
			if (!r[i].resp) {
				for (int j = 0; j < i; j++)
					free(r[j].resp);
				free(r);
				return P_BUF_ERR;
			}
			break;
		case P_ERROR_MSG:
		case P_TEXT_INFO:
			break;
		default:
			for (int j = 0; j < i; j++)
				free(r[j].resp);
			free(r);
			return P_CONV_ERR;
		}
	}
	*resp = r;
	return P_SUCCESS;
}

// poolerd_pam_check runs service's authentication and account checks for
// user with password; *stage says which step answered (1 start, 2
// authenticate, 3 account). It returns PAM's code; its text is in err.
static int poolerd_pam_check(poolerd_pam *p, const char *service, const char *user, const char *password,
		const char *rhost, int *stage, char *err, size_t errlen) {
	struct pam_conv conv = { poolerd_pam_conv, (void *)password };
	pam_handle_t *h = NULL;
	*stage = 1;
	int rc = p->start(service, user, &conv, &h);
	if (rc == P_SUCCESS && rhost && *rhost)
		rc = p->set_item(h, P_RHOST, rhost);
	if (rc == P_SUCCESS) {
		*stage = 2;
		rc = p->authenticate(h, P_SILENT);
	}
	if (rc == P_SUCCESS) {
		*stage = 3;
		rc = p->acct_mgmt(h, P_SILENT);
	}
	const char *e = p->strerror(h, rc);
	strncpy(err, e ? e : "unknown PAM error", errlen - 1);
	err[errlen - 1] = 0;
	if (h)
		p->end(h, rc);
	return rc;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Lib is the loaded PAM library.
type Lib struct{ p *C.poolerd_pam }

// Open loads libpam.so.0.
func Open() (*Lib, error) {
	var buf [256]C.char
	p := C.poolerd_pam_open(&buf[0], C.size_t(len(buf)))
	if p == nil {
		return nil, fmt.Errorf("PAM is not available: %s (install the PAM library: apt-get install libpam0g)", C.GoString(&buf[0]))
	}
	return &Lib{p: p}, nil
}

// Close lets the library go; l is not used afterwards.
func (l *Lib) Close() {
	C.poolerd_pam_close(l.p)
	l.p = nil
}

// pamSuccess is PAM_SUCCESS.
const pamSuccess = 0

// Authenticate checks user's password with service's modules
// (pam_authenticate, then pam_acct_mgmt); rhost, if not empty, is the
// client's address (PAM_RHOST). It returns nil when PAM accepted, an error
// wrapping ErrFailed otherwise, with PAM's reason.
func (l *Lib) Authenticate(service, user, password, rhost string) error {
	if password == "" {
		return fmt.Errorf("%w: empty password", ErrFailed)
	}
	if service == "" || user == "" {
		return errors.New("PAM: no service or user name")
	}
	cs, cu, cp, cr := C.CString(service), C.CString(user), C.CString(password), C.CString(rhost)
	defer func() {
		C.free(unsafe.Pointer(cs))
		C.free(unsafe.Pointer(cu))
		// The password's copy is wiped before it is freed.
		C.memset(unsafe.Pointer(cp), 0, C.size_t(len(password)))
		C.free(unsafe.Pointer(cp))
		C.free(unsafe.Pointer(cr))
	}()
	var stage C.int
	var buf [256]C.char
	rc := C.poolerd_pam_check(l.p, cs, cu, cp, cr, &stage, &buf[0], C.size_t(len(buf)))
	if rc == pamSuccess {
		return nil
	}
	step := map[C.int]string{1: "pam_start", 2: "pam_authenticate", 3: "pam_acct_mgmt"}[stage]
	return fmt.Errorf("%w: %s of service %q: %s (PAM code %d)", ErrFailed, step, service, C.GoString(&buf[0]), int(rc))
}
