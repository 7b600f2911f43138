// Package mdtable reads the rows of Markdown tables, for the tests that
// check poolerd's docs against its code and its running daemon. It splits
// rows into cells and nothing more: no Markdown rendering.
package mdtable

import "strings"

// Cells splits a Markdown table row into its trimmed cells, leaving a |
// inside a code span or escaped as \| in its cell. A line that does not
// start with | (after spaces) is not a row: nil.
func Cells(row string) []string {
	row = strings.TrimSpace(row)
	if !strings.HasPrefix(row, "|") {
		return nil
	}
	row = strings.TrimPrefix(strings.TrimSuffix(row, "|"), "|")
	var out []string
	var cur strings.Builder
	inCode := false
	for i := 0; i < len(row); i++ {
		switch {
		case row[i] == '`':
			inCode = !inCode
		case row[i] == '\\' && i+1 < len(row) && row[i+1] == '|':
			cur.WriteByte('|')
			i++
			continue
		case row[i] == '|' && !inCode:
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
			continue
		}
		cur.WriteByte(row[i])
	}
	return append(out, strings.TrimSpace(cur.String()))
}
