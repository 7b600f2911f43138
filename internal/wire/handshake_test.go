package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

func TestReadStartupExactAndCapped(t *testing.T) {
	pkt := binary.BigEndian.AppendUint32(nil, 8)
	pkt = binary.BigEndian.AppendUint32(pkt, CodeSSL)
	next := []byte("after")
	r := iotest.OneByteReader(bytes.NewReader(append(pkt, next...)))
	body, err := ReadStartup(r)
	if err != nil || binary.BigEndian.Uint32(body) != CodeSSL {
		t.Fatalf("body %v err %v", body, err)
	}
	rest, _ := io.ReadAll(r)
	if string(rest) != "after" {
		t.Fatalf("ReadStartup read past the packet: rest %q", rest)
	}
	for _, l := range []uint32{0, 7, MaxStartupLen + 1, 1 << 31} {
		_, err := ReadStartup(bytes.NewReader(binary.BigEndian.AppendUint32(nil, l)))
		var le *StartupLengthError
		if !errors.As(err, &le) || le.Len != int(int32(l)) {
			t.Errorf("length %d: want a StartupLengthError, got %v", l, err)
		}
	}
}

func TestReadMessageCapped(t *testing.T) {
	m := AppendQuery(nil, "SELECT 1")
	typ, body, err := ReadMessage(bytes.NewReader(m), 100)
	if err != nil || typ != 'Q' || string(body) != "SELECT 1\x00" {
		t.Fatalf("%q %q %v", typ, body, err)
	}
	if _, _, err := ReadMessage(bytes.NewReader(m), 3); err == nil {
		t.Fatal("body over the cap accepted")
	}
	if _, _, err := ReadMessage(bytes.NewReader(m[:7]), 100); err != io.ErrUnexpectedEOF && err == nil {
		t.Fatalf("short message: %v", err)
	}
}

func FuzzReadStartup(f *testing.F) {
	f.Add(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), CodeCancel))
	f.Fuzz(func(t *testing.T, b []byte) {
		body, err := ReadStartup(bytes.NewReader(b))
		if err == nil && (len(body) < 4 || len(body) > MaxStartupLen) {
			t.Fatalf("body of %d bytes accepted", len(body))
		}
	})
}
