package hba

import (
	"bufio"
	"bytes"
	"fmt"
	"regexp"
	"strings"
)

// IdentMaps are user-name maps in PostgreSQL's pg_ident.conf format, as
// PgBouncer reads them (auth_ident_file): each line is
//
//	MAPNAME  SYSTEM-USERNAME  DATABASE-USERNAME
//
// and says that a client whose operating-system user (peer) or
// certificate common name (cert) is SYSTEM-USERNAME may log in as
// DATABASE-USERNAME, under a rule with map=MAPNAME. A SYSTEM-USERNAME
// starting with a slash is a regular expression (unanchored, as in
// PostgreSQL: write ^ and $), whose first parenthesized match replaces \1
// in DATABASE-USERNAME. A DATABASE-USERNAME of all admits every user.
// Comments start with #; names may be double-quoted.
type IdentMaps map[string][]identLine

type identLine struct {
	system string         // a plain name, when re is nil
	re     *regexp.Regexp // a SYSTEM-USERNAME starting with /
	dbUser string
	all    bool // DATABASE-USERNAME all (unquoted)
}

// ParseIdent reads an ident map file; path names it in errors.
func ParseIdent(path string, data []byte) (IdentMaps, error) {
	maps := IdentMaps{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields, quoted, err := identFields(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		switch len(fields) {
		case 0:
			continue
		case 3:
		default:
			return nil, fmt.Errorf("%s:%d: an ident map line has three fields (map name, system user, database user), not %d", path, n, len(fields))
		}
		l := identLine{system: fields[1], dbUser: fields[2], all: fields[2] == "all" && !quoted[2]}
		if strings.HasPrefix(l.dbUser, "+") && !quoted[2] {
			return nil, fmt.Errorf("%s:%d: group membership (%s) is not supported: list the users", path, n, l.dbUser)
		}
		if strings.HasPrefix(l.system, "/") {
			re, err := regexp.Compile(l.system[1:])
			if err != nil {
				return nil, fmt.Errorf("%s:%d: regular expression %q: %w", path, n, l.system[1:], err)
			}
			l.re = re
		}
		maps[fields[0]] = append(maps[fields[0]], l)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return maps, nil
}

// identFields splits a line into blank-separated fields, a double-quoted
// one kept whole ("" inside is a quote), and says which were quoted.
func identFields(line string) ([]string, []bool, error) {
	var out []string
	var quoted []bool
	for i := 0; i < len(line); {
		c := line[i]
		if c == ' ' || c == '\t' || c == '\r' {
			i++
			continue
		}
		if c != '"' {
			j := i
			for j < len(line) && line[j] != ' ' && line[j] != '\t' && line[j] != '\r' {
				j++
			}
			out, quoted = append(out, line[i:j]), append(quoted, false)
			i = j
			continue
		}
		var b strings.Builder
		j := i + 1
		for {
			if j >= len(line) {
				return nil, nil, fmt.Errorf("unterminated quoted name")
			}
			if line[j] == '"' {
				if j+1 < len(line) && line[j+1] == '"' {
					b.WriteByte('"')
					j += 2
					continue
				}
				break
			}
			b.WriteByte(line[j])
			j++
		}
		out, quoted = append(out, b.String()), append(quoted, true)
		i = j + 1
	}
	return out, quoted, nil
}

// Allows reports whether map name lets system (an operating-system user or
// a certificate's name) log in as dbUser. A map that does not exist allows
// nothing.
func (m IdentMaps) Allows(name, system, dbUser string) bool {
	for _, l := range m[name] {
		if l.re == nil {
			if l.system == system && (l.all || l.dbUser == dbUser) {
				return true
			}
			continue
		}
		sub := l.re.FindStringSubmatch(system)
		if sub == nil {
			continue
		}
		want := l.dbUser
		if len(sub) > 1 {
			want = strings.ReplaceAll(want, `\1`, sub[1])
		}
		if l.all || want == dbUser {
			return true
		}
	}
	return false
}

// Names lists the map names, for checking the rules' map options.
func (m IdentMaps) Names() map[string]bool {
	out := map[string]bool{}
	for n := range m {
		out[n] = true
	}
	return out
}
