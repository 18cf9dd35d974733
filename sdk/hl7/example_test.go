package hl7_test

import (
	"fmt"
	"time"

	"github.com/sandbot/sandbot/sdk/hl7"
)

func Example() {
	in := []byte("MSH|^~\\&|LAB|HOSP|EHR|HOSP|20240101120000||ORU^R01^ORU_R01|MSG1|P|2.5.1\r" +
		"PID|1||123^^^HOSP^MR~456^^^STATE^SS||DOE^JANE||19800101|F\r" +
		"OBX|1|ST|GLU^Glucose||high \\T\\ rising||||||F\r" +
		"OBX|2|NM|HGB^Hemoglobin||13.5|g/dL|||||F\r")
	m, err := hl7.Parse(in)
	if err != nil {
		panic(err)
	}
	fmt.Println(m.Get("PID-3[2].1").Value(), m.Get("PID-5.2").Value(), m.Get("OBX(2)-5").Value())
	fmt.Println(m.Get("OBX-5").String(), "=>", m.Get("OBX-5").Value())

	_ = m.Set("PID-5.2", "JANE^MARIE")
	fmt.Println(m.Segment("PID", 1).Field(5).String())

	ack, _ := m.Ack(hl7.AckOptions{
		Code:      "AA",
		ControlID: "ACK1",
		Now:       func() time.Time { return time.Date(2024, 1, 1, 12, 0, 1, 0, time.UTC) },
	})
	fmt.Printf("%q\n", ack.String())
	// Output:
	// 456 JANE 13.5
	// high \T\ rising => high & rising
	// DOE^JANE\S\MARIE
	// "MSH|^~\\&|EHR|HOSP|LAB|HOSP|20240101120001+0000||ACK^R01^ACK|ACK1|P|2.5.1\rMSA|AA|MSG1\r"
}
