package wire

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

func TestErrorRoundTrip(t *testing.T) {
	e := &Error{Severity: "FATAL", Code: "53300", Message: "m", Detail: "d", Hint: "h"}
	b := e.Append(nil)
	var er pgproto3.ErrorResponse
	if b[0] != 'E' {
		t.Fatalf("type %q", b[0])
	}
	if err := er.Decode(b[HeaderLen:]); err != nil {
		t.Fatal(err)
	}
	if er.Severity != "FATAL" || er.SeverityUnlocalized != "FATAL" || er.Code != "53300" || er.Message != "m" || er.Detail != "d" || er.Hint != "h" {
		t.Fatalf("decoded %+v", er)
	}
	sev, code, msg := ErrorFields(b[HeaderLen:])
	if sev != "FATAL" || code != "53300" || msg != "m" {
		t.Fatalf("ErrorFields: %q %q %q", sev, code, msg)
	}
}

func TestParameterStatusRoundTrip(t *testing.T) {
	b := AppendParameterStatus(nil, "TimeZone", "UTC")
	name, value, ok := ParseParameterStatus(b[HeaderLen:])
	if !ok || name != "TimeZone" || value != "UTC" {
		t.Fatalf("got %q %q %v", name, value, ok)
	}
	if _, _, ok := ParseParameterStatus([]byte("no-terminator")); ok {
		t.Fatal("accepted a malformed body")
	}
}

func FuzzErrorFields(f *testing.F) {
	f.Add((&Error{Severity: "ERROR", Code: "42P01", Message: "x"}).Append(nil)[HeaderLen:])
	f.Add([]byte("S"))
	f.Fuzz(func(t *testing.T, body []byte) {
		ErrorFields(body)
		ParseParameterStatus(body)
	})
}
