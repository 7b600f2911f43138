package proxy

import (
	"testing"
	"unsafe"
)

// TestSessionRecordSize: every idle client keeps its session record, so
// the record stays within the 1,152-byte allocation size class (with the
// allocator's 8-byte header for objects of over 512 bytes with pointers);
// the next class is 1,280. State needed only during a login (loginState)
// or a request belongs elsewhere.
func TestSessionRecordSize(t *testing.T) {
	const class, header = 1152, 8
	if n := unsafe.Sizeof(session{}); n+header > class {
		t.Errorf("session is %d bytes: with the allocator's header it no longer fits the %d-byte size class, and every idle client costs %d bytes more; move state an idle client does not need out of it (or reorder bool fields into padding)",
			n, class, 1280-class)
	}
}
