package wire

import (
	"encoding/binary"
	"fmt"
)

// Transaction status bytes of ReadyForQuery.
const (
	TxIdle   = 'I'
	TxInTx   = 'T'
	TxFailed = 'E'
)

// Error is a PostgreSQL error or notice that poolerd itself sends a client.
// Every refusal carries a SQLSTATE and a detail or hint that says what to do.
type Error struct {
	// Severity is ERROR or FATAL (FATAL closes the connection).
	Severity string
	// Code is the SQLSTATE.
	Code    string
	Message string
	Detail  string
	Hint    string
}

// Error implements error.
func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s (SQLSTATE %s)", e.Severity, e.Message, e.Code)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Fatal reports whether the connection ends after this error.
func (e *Error) Fatal() bool { return e.Severity == "FATAL" }

// Append encodes e as an ErrorResponse.
func (e *Error) Append(dst []byte) []byte { return e.appendAs(dst, 'E') }

// AppendNotice encodes e as a NoticeResponse.
func (e *Error) AppendNotice(dst []byte) []byte { return e.appendAs(dst, 'N') }

func (e *Error) appendAs(dst []byte, typ byte) []byte {
	start := len(dst)
	dst = append(dst, typ, 0, 0, 0, 0)
	field := func(code byte, v string) {
		if v != "" {
			dst = append(dst, code)
			dst = append(dst, v...)
			dst = append(dst, 0)
		}
	}
	field('S', e.Severity)
	field('V', e.Severity)
	field('C', e.Code)
	field('M', e.Message)
	field('D', e.Detail)
	field('H', e.Hint)
	dst = append(dst, 0)
	binary.BigEndian.PutUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// AppendAuthOk appends AuthenticationOk.
func AppendAuthOk(dst []byte) []byte { return append(dst, 'R', 0, 0, 0, 8, 0, 0, 0, 0) }

// AppendReadyForQuery appends a ReadyForQuery with the given status.
func AppendReadyForQuery(dst []byte, status byte) []byte {
	return append(dst, 'Z', 0, 0, 0, 5, status)
}

// AppendParameterStatus appends a ParameterStatus message.
func AppendParameterStatus(dst []byte, name, value string) []byte {
	start := len(dst)
	dst = append(dst, 'S', 0, 0, 0, 0)
	dst = append(dst, name...)
	dst = append(dst, 0)
	dst = append(dst, value...)
	dst = append(dst, 0)
	binary.BigEndian.PutUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// AppendBackendKeyData appends a BackendKeyData message (protocol 3.0 key).
func AppendBackendKeyData(dst []byte, pid, key uint32) []byte {
	dst = append(dst, 'K', 0, 0, 0, 12)
	dst = binary.BigEndian.AppendUint32(dst, pid)
	return binary.BigEndian.AppendUint32(dst, key)
}

// AppendQuery appends a simple Query message.
func AppendQuery(dst []byte, sql string) []byte { return appendStringMessage(dst, 'Q', sql) }

// AppendCommandComplete appends a CommandComplete message with tag.
func AppendCommandComplete(dst []byte, tag string) []byte { return appendStringMessage(dst, 'C', tag) }

// appendStringMessage appends a message of type typ whose body is s and a
// NUL.
func appendStringMessage(dst []byte, typ byte, s string) []byte {
	start := len(dst)
	dst = append(dst, typ, 0, 0, 0, 0)
	dst = append(dst, s...)
	dst = append(dst, 0)
	binary.BigEndian.PutUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// AppendTerminate appends a Terminate message.
func AppendTerminate(dst []byte) []byte { return append(dst, 'X', 0, 0, 0, 4) }

// AppendCancelRequest appends a CancelRequest packet (protocol 3.0 key).
func AppendCancelRequest(dst []byte, pid uint32, key []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(12+len(key)))
	dst = binary.BigEndian.AppendUint32(dst, CodeCancel)
	dst = binary.BigEndian.AppendUint32(dst, pid)
	return append(dst, key...)
}

// ParseParameterStatus splits a ParameterStatus body into name and value.
func ParseParameterStatus(body []byte) (name, value string, ok bool) {
	i := indexZero(body)
	if i < 0 {
		return "", "", false
	}
	j := indexZero(body[i+1:])
	if j < 0 {
		return "", "", false
	}
	return string(body[:i]), string(body[i+1 : i+1+j]), true
}

// ErrorFields extracts severity (non-localised V, or S), SQLSTATE and
// message from an ErrorResponse or NoticeResponse body. Missing fields are empty.
func ErrorFields(body []byte) (severity, code, message string) {
	for len(body) > 0 && body[0] != 0 {
		f := body[0]
		end := indexZero(body[1:])
		if end < 0 {
			return
		}
		v := body[1 : 1+end]
		switch f {
		case 'V':
			severity = string(v)
		case 'S':
			if severity == "" {
				severity = string(v)
			}
		case 'C':
			code = string(v)
		case 'M':
			message = string(v)
		}
		body = body[2+end:]
	}
	return
}

func indexZero(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}
