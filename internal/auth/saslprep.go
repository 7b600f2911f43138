package auth

import (
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/bidi"
	"golang.org/x/text/unicode/norm"
	"golang.org/x/text/unicode/rangetable"
)

// SASLprep normalizes a password the way PostgreSQL does before using it
// for SCRAM (pg_saslprep in src/common/saslprep.c, used by both the server
// when it builds a verifier and libpq when it authenticates).
//
// PostgreSQL never rejects a password because of SASLprep: if the input is
// not valid UTF-8 or the SASLprep profile (RFC 4013, built on the
// stringprep framework of RFC 3454) prohibits the result, the raw password
// bytes are used unchanged. SASLprep does the same.
//
// Steps, in PostgreSQL's order:
//
//  1. Pure ASCII input (any bytes below 0x80, control characters
//     included) is returned unchanged.
//  2. Map: non-ASCII space characters (RFC 3454 table C.1.2) become U+0020
//     and the "commonly mapped to nothing" characters (table B.1) are
//     removed. U+200B is in both tables; like PostgreSQL it becomes a space.
//  3. An empty result is prohibited.
//  4. Normalize with Unicode NFKC.
//  5. Prohibit output characters from tables C.1.2, C.2.1, C.2.2, C.3, C.4,
//     C.5, C.6, C.7, C.8 and C.9, and unassigned code points (table A.1).
//  6. Bidi: if the result has a right-to-left character (bidi class R or
//     AL) it must contain no left-to-right (class L) character, and must
//     start and end with a right-to-left character.
//
// Approximations, documented because they can matter for exotic passwords:
//
//   - Table A.1 lists code points unassigned in Unicode 3.2. Go has no
//     Unicode 3.2 tables; the oldest available ones are Unicode 4.1
//     (golang.org/x/text/unicode/rangetable). Characters added in Unicode
//     4.0 or 4.1 are therefore accepted here but prohibited by PostgreSQL.
//     Such a password is only affected if it also contains a character that
//     step 2 or 4 changes.
//   - Tables D.1/D.2 (bidi classes) are taken from the Unicode version of
//     golang.org/x/text/unicode/bidi instead of Unicode 3.2, and NFKC uses
//     golang.org/x/text's Unicode version rather than PostgreSQL's. Bidi
//     classes and normalization of characters that existed in Unicode 3.2
//     are stable, so this only matters for characters that step 5 would
//     reject in PostgreSQL anyway.
//   - The non-ASCII space (C.1.2), mapped-to-nothing (B.1) and prohibited
//     output (C.*) tables are transcribed from RFC 3454 and are exact.
func SASLprep(password string) string {
	if isASCII(password) {
		return password
	}
	if !utf8.ValidString(password) {
		return password
	}

	// 1) Map.
	mapped := make([]rune, 0, len(password))
	for _, r := range password {
		switch {
		case inRanges(r, nonASCIISpaceRanges):
			mapped = append(mapped, ' ')
		case inRanges(r, mappedToNothingRanges):
			// removed
		default:
			mapped = append(mapped, r)
		}
	}
	if len(mapped) == 0 {
		return password // PostgreSQL treats an empty result as prohibited
	}

	// 2) Normalize.
	out := norm.NFKC.String(string(mapped))
	if out == "" {
		return password
	}

	// 3) Prohibit, and collect what the bidi check needs.
	var hasRandAL, hasL bool
	var first, last rune
	i := 0
	for _, r := range out {
		if i == 0 {
			first = r
		}
		last = r
		i++
		if inRanges(r, prohibitedOutputRanges) || !isAssigned(r) {
			return password
		}
		switch bidiClass(r) {
		case bidi.R, bidi.AL:
			hasRandAL = true
		case bidi.L:
			hasL = true
		}
	}

	// 4) Check bidi.
	if hasRandAL {
		if hasL {
			return password
		}
		if !isRandAL(first) || !isRandAL(last) {
			return password
		}
	}
	return out
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func bidiClass(r rune) bidi.Class {
	p, _ := bidi.LookupRune(r)
	return p.Class()
}

func isRandAL(r rune) bool {
	c := bidiClass(r)
	return c == bidi.R || c == bidi.AL
}

// assignedTable approximates "assigned in Unicode 3.2" (see SASLprep).
var assignedTable = func() *unicode.RangeTable {
	if t := rangetable.Assigned("4.1.0"); t != nil {
		return t
	}
	// Not expected; fall back to the Unicode version of package unicode.
	return rangetable.Merge(unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z, unicode.C)
}()

func isAssigned(r rune) bool {
	return unicode.Is(assignedTable, r)
}

// runeRange is an inclusive range of code points.
type runeRange struct{ lo, hi rune }

func inRanges(r rune, table []runeRange) bool {
	// The tables are short; a linear scan that stops early is fast enough
	// and obviously correct.
	for _, rr := range table {
		if r < rr.lo {
			return false
		}
		if r <= rr.hi {
			return true
		}
	}
	return false
}

// RFC 3454 table C.1.2: non-ASCII space characters.
var nonASCIISpaceRanges = []runeRange{
	{0x00A0, 0x00A0},
	{0x1680, 0x1680},
	{0x2000, 0x200B},
	{0x202F, 0x202F},
	{0x205F, 0x205F},
	{0x3000, 0x3000},
}

// RFC 3454 table B.1: commonly mapped to nothing.
var mappedToNothingRanges = []runeRange{
	{0x00AD, 0x00AD},
	{0x034F, 0x034F},
	{0x1806, 0x1806},
	{0x180B, 0x180D},
	{0x200B, 0x200D},
	{0x2060, 0x2060},
	{0xFE00, 0xFE0F},
	{0xFEFF, 0xFEFF},
}

// The union of the RFC 3454 tables SASLprep (RFC 4013 section 2.3) lists as
// prohibited output, sorted, with overlapping and adjacent ranges merged.
var prohibitedOutputRanges = []runeRange{
	{0x0000, 0x001F},    // C.2.1
	{0x007F, 0x00A0},    // C.2.1, C.2.2, C.1.2
	{0x0340, 0x0341},    // C.8
	{0x06DD, 0x06DD},    // C.2.2
	{0x070F, 0x070F},    // C.2.2
	{0x1680, 0x1680},    // C.1.2
	{0x180E, 0x180E},    // C.2.2
	{0x2000, 0x200F},    // C.1.2, C.2.2, C.8
	{0x2028, 0x202F},    // C.2.2, C.8, C.1.2
	{0x205F, 0x2063},    // C.1.2, C.2.2
	{0x206A, 0x206F},    // C.2.2, C.8
	{0x2FF0, 0x2FFB},    // C.7
	{0x3000, 0x3000},    // C.1.2
	{0xD800, 0xF8FF},    // C.5, C.3
	{0xFDD0, 0xFDEF},    // C.4
	{0xFEFF, 0xFEFF},    // C.2.2
	{0xFFF9, 0xFFFF},    // C.2.2, C.6, C.4
	{0x1D173, 0x1D17A},  // C.2.2
	{0x1FFFE, 0x1FFFF},  // C.4
	{0x2FFFE, 0x2FFFF},  // C.4
	{0x3FFFE, 0x3FFFF},  // C.4
	{0x4FFFE, 0x4FFFF},  // C.4
	{0x5FFFE, 0x5FFFF},  // C.4
	{0x6FFFE, 0x6FFFF},  // C.4
	{0x7FFFE, 0x7FFFF},  // C.4
	{0x8FFFE, 0x8FFFF},  // C.4
	{0x9FFFE, 0x9FFFF},  // C.4
	{0xAFFFE, 0xAFFFF},  // C.4
	{0xBFFFE, 0xBFFFF},  // C.4
	{0xCFFFE, 0xCFFFF},  // C.4
	{0xDFFFE, 0xDFFFF},  // C.4
	{0xE0001, 0xE0001},  // C.9
	{0xE0020, 0xE007F},  // C.9
	{0xEFFFE, 0xEFFFF},  // C.4
	{0xF0000, 0x10FFFF}, // C.3, C.4
}
