package console

import (
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/poolerd/poolerd/internal/wire"
)

// PostgreSQL type OIDs used by the console, as PgBouncer sends them.
const (
	oidText    = 25
	oidInt4    = 23
	oidInt8    = 20
	oidNumeric = 1700
)

// resultSet builds a console reply: RowDescription, DataRows, CommandComplete.
type resultSet struct {
	buf  []byte
	cols int
}

type column struct {
	name string
	oid  uint32
}

func text(name string) column    { return column{name, oidText} }
func int4(name string) column    { return column{name, oidInt4} }
func numeric(name string) column { return column{name, oidNumeric} }
func int8c(name string) column   { return column{name, oidInt8} }

func newResult(cols ...column) *resultSet {
	r := &resultSet{cols: len(cols)}
	start := len(r.buf)
	r.buf = append(r.buf, 'T', 0, 0, 0, 0)
	r.buf = binary.BigEndian.AppendUint16(r.buf, uint16(len(cols)))
	for _, c := range cols {
		r.buf = append(r.buf, c.name...)
		r.buf = append(r.buf, 0)
		r.buf = binary.BigEndian.AppendUint32(r.buf, 0) // table OID
		r.buf = binary.BigEndian.AppendUint16(r.buf, 0) // column number
		r.buf = binary.BigEndian.AppendUint32(r.buf, c.oid)
		size := int16(-1)
		switch c.oid {
		case oidInt4:
			size = 4
		case oidInt8:
			size = 8
		}
		r.buf = binary.BigEndian.AppendUint16(r.buf, uint16(size))
		r.buf = binary.BigEndian.AppendUint32(r.buf, 0xffffffff) // typmod -1
		r.buf = binary.BigEndian.AppendUint16(r.buf, 0)          // text format
	}
	binary.BigEndian.PutUint32(r.buf[start+1:], uint32(len(r.buf)-start-1))
	return r
}

// null is a NULL value in a row.
type null struct{}

// row appends a DataRow; values are strings, integers, null{} or *string.
func (r *resultSet) row(values ...any) {
	start := len(r.buf)
	r.buf = append(r.buf, 'D', 0, 0, 0, 0)
	r.buf = binary.BigEndian.AppendUint16(r.buf, uint16(len(values)))
	for _, v := range values {
		var s string
		switch x := v.(type) {
		case null:
			r.buf = binary.BigEndian.AppendUint32(r.buf, 0xffffffff)
			continue
		case *string:
			if x == nil {
				r.buf = binary.BigEndian.AppendUint32(r.buf, 0xffffffff)
				continue
			}
			s = *x
		case string:
			s = x
		case int:
			s = strconv.Itoa(x)
		case int64:
			s = strconv.FormatInt(x, 10)
		case uint64:
			s = strconv.FormatUint(x, 10)
		default:
			s = fmt.Sprint(x)
		}
		r.buf = binary.BigEndian.AppendUint32(r.buf, uint32(len(s)))
		r.buf = append(r.buf, s...)
	}
	binary.BigEndian.PutUint32(r.buf[start+1:], uint32(len(r.buf)-start-1))
}

// done appends CommandComplete with tag.
func (r *resultSet) done(tag string) []byte { return wire.AppendCommandComplete(r.buf, tag) }

// pgTime formats a time like PgBouncer's console (text, local time).
func pgTime(t time.Time) string {
	if t.IsZero() {
		t = time.Now()
	}
	return t.Local().Format("2006-01-02 15:04:05 MST")
}

// splitAddr splits host:port for the console's addr and port columns.
func splitAddr(a net.Addr) (string, int) {
	if a == nil {
		return "", 0
	}
	if a.Network() == "unix" {
		return "unix", 0
	}
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String(), 0
	}
	p, _ := strconv.Atoi(port)
	return host, p
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
