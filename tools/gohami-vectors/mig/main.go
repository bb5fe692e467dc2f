// Command mig hands the inputs of cases.json to Go HAMi's own dynamic-MIG functions (the
// profile allow-list check, the NVIDIA scheduler's choice of profile and placement, the
// reservation annotation's writer and reader, the register value with MIG profiles) and
// writes what each returned, so that hami.protocol.mig can be compared with Go HAMi case by
// case (tests/test_mig_go_vectors.py). It is built against an unpacked Go HAMi tree by
// scripts/gen-go-vectors.sh; nothing of Go HAMi is copied into this repository.
//
//	mig -cases cases.json -out vectors.json -commit <sha> -command "<how it was run>"
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/Project-HAMi/HAMi/pkg/device"
	"github.com/Project-HAMi/HAMi/pkg/device/nvidia"
)

const functions = "nvidia.ValidateMigProfileAllowlist, NvidiaGPUDevices.CustomFilterRule, " +
	"NvidiaGPUDevices.AddResourceUsage, nvidia.EncodeMigAllocations, nvidia.DecodeMigAllocations, " +
	"json.Marshal([]nvidia.MigAllocation), device.MarshalNodeDevices, device.UnMarshalNodeDevices, " +
	"NvidiaGPUDevices.GetNodeDevices"

type obj = map[string]any

// slot is one device of a container in an allocations_encode case; an empty profile is a
// device without a MIG reservation (EncodeMigAllocations skips it).
type slot struct {
	UUID      string              `json:"uuid"`
	Profile   string              `json:"profile"`
	Placement device.MigPlacement `json:"placement"`
}

type caseFile struct {
	Allowlist []struct {
		Name    string                      `json:"name"`
		Entries []device.AllowedMigProfiles `json:"entries"`
	} `json:"allowlist"`
	Select []struct {
		Name     string                `json:"name"`
		Profiles []device.MigProfile   `json:"profiles"`
		Occupied []device.MigPlacement `json:"occupied"`
		Requests []int32               `json:"requests"`
	} `json:"select"`
	AllocationsEncode []struct {
		Name       string   `json:"name"`
		Containers [][]slot `json:"containers"`
	} `json:"allocations_encode"`
	AllocationsDecode []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"allocations_decode"`
	RegisterEncode []struct {
		Name    string               `json:"name"`
		Devices []*device.DeviceInfo `json:"devices"`
	} `json:"register_encode"`
	RegisterDecode []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"register_decode"`
}

func main() {
	runGenerator("mig vectors", "cases", "inputs (cases.json)", true, run)
}

func run(casesPath, outPath, commit, command, goVersion string) error {
	var in caseFile
	if err := readJSON(casesPath, &in); err != nil {
		return err
	}
	gpuConfig := nvidia.NvidiaConfig{ResourceCountName: "nvidia.com/gpu"}
	gpus := nvidia.InitNvidiaDevice(gpuConfig)

	file := obj{
		"about": obj{
			"functions": functions,
			"generated": time.Now().UTC().Format(time.RFC3339),
			"generator": "tools/gohami-vectors/mig, this project's program calling the Go HAMi " +
				"functions listed in \"functions\" on the inputs of tools/gohami-vectors/mig/cases.json",
			"command": command,
			"go":      goVersion,
			"hami":    commit,
			"note": "every 'go' field is what HAMi's own function returned; select: each request " +
				"is placed after the ones before it (AddResourceUsage on one MIG DeviceUsage)",
		},
		"keys": obj{"mig_allocations": nvidia.MigAllocationsAnnotation, "mig_mode": nvidia.MigMode},
	}

	var section []obj
	for _, c := range in.Allowlist {
		got := obj{"ok": true}
		if err := nvidia.ValidateMigProfileAllowlist(c.Entries); err != nil {
			got = obj{"ok": false, "error": err.Error()}
		}
		entries := []obj{} // AllowedMigProfiles has YAML tags only: recorded under its YAML names
		for _, e := range c.Entries {
			entries = append(entries, obj{"models": e.Models, "profiles": e.Profiles})
		}
		section = append(section, obj{"name": c.Name, "entries": entries, "go": got})
	}
	file["allowlist"], section = section, nil

	for _, c := range in.Select {
		section = append(section, selectCase(gpus, c.Name, c.Profiles, c.Occupied, c.Requests))
	}
	file["select"], section = section, nil

	for _, c := range in.AllocationsEncode {
		pd := device.PodSingleDevice{}
		for _, ctr := range c.Containers {
			cd := device.ContainerDevices{}
			for _, s := range ctr {
				d := device.ContainerDevice{UUID: s.UUID, Type: nvidia.NvidiaGPUDevice}
				if s.Profile != "" {
					d.CustomInfo = map[string]any{
						nvidia.MigProfileCustomInfo:   s.Profile,
						nvidia.MigPlacementCustomInfo: s.Placement,
					}
				}
				cd = append(cd, d)
			}
			pd = append(pd, cd)
		}
		value, ok := nvidia.EncodeMigAllocations(pd)
		section = append(section, obj{
			"name": c.Name, "containers": c.Containers, "value": value, "go_ok": ok,
			"go_decoded": decodeResult(value),
		})
	}
	file["allocations_encode"], section = section, nil

	for _, c := range in.AllocationsDecode {
		section = append(section, obj{"name": c.Name, "value": c.Value, "go": decodeResult(c.Value)})
	}
	file["allocations_decode"], section = section, nil

	for _, c := range in.RegisterEncode {
		value := device.MarshalNodeDevices(c.Devices)
		section = append(section, obj{
			"name": c.Name, "devices": c.Devices, "value": value,
			"go_decoded": registerResult(value), "go_nvidia_getnodedevices": getNodeDevices(gpuConfig, value),
		})
	}
	file["register_encode"], section = section, nil

	for _, c := range in.RegisterDecode {
		section = append(section, obj{
			"name": c.Name, "value": c.Value, "go": registerResult(c.Value),
			"go_nvidia_getnodedevices": getNodeDevices(gpuConfig, c.Value),
		})
	}
	file["register_decode"] = section

	body, err := json.MarshalIndent(file, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(outPath, append(body, '\n'), 0o644)
}

// selectCase places each request in turn on one MIG GPU the way Go's scheduler does: the
// filter (CustomFilterRule) says whether it fits, AddResourceUsage picks profile and
// placement and records the placement as in use for the next request.
func selectCase(gpus *nvidia.NvidiaGPUDevices, name string, profiles []device.MigProfile,
	occupied []device.MigPlacement, requests []int32) obj {
	usage := &device.DeviceUsage{ID: "GPU-mig", Mode: nvidia.MigMode, MigProfiles: profiles, Count: 100,
		Totalmem: 1 << 30, Totalcore: 100, Health: true}
	for _, p := range occupied {
		usage.MigAllocationsInUse = append(usage.MigAllocationsInUse, device.MigAllocation{Profile: "held", Placement: p})
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p"}}
	results := []obj{}
	for _, memory := range requests {
		request := device.ContainerDeviceRequest{Nums: 1, Type: nvidia.NvidiaGPUDevice, Memreq: memory}
		fits := gpus.CustomFilterRule(nil, request, nil, usage)
		ctr := &device.ContainerDevice{UUID: usage.ID, Type: nvidia.NvidiaGPUDevice, Usedmem: memory}
		r := obj{"memory": memory, "go_filter_fits": fits}
		if err := gpus.AddResourceUsage(pod, usage, ctr); err != nil {
			r["go"] = obj{"ok": false, "error": err.Error()}
		} else {
			r["go"] = obj{
				"ok": true, "profile": ctr.CustomInfo[nvidia.MigProfileCustomInfo],
				"placement": ctr.CustomInfo[nvidia.MigPlacementCustomInfo],
				"usedmem":   ctr.Usedmem, "usedcores": ctr.Usedcores,
			}
		}
		results = append(results, r)
	}
	return obj{"name": name, "profiles": profiles, "occupied": occupied, "requests": results}
}

// decodeResult is DecodeMigAllocations' answer and, when it read the value, json.Marshal of
// what it read (the form Go's device plugin writes back after filling the runtime fields).
func decodeResult(value string) obj {
	list, err := nvidia.DecodeMigAllocations(value)
	if err != nil {
		return obj{"ok": false, "error": err.Error()}
	}
	raw, err := json.Marshal(list)
	if err != nil {
		return obj{"ok": false, "error": "marshal: " + err.Error()}
	}
	return obj{"ok": true, "allocations": list, "null": list == nil, "marshal": string(raw)}
}

func deviceOut(d *device.DeviceInfo) obj {
	return obj{
		"id": d.ID, "index": d.Index, "count": d.Count, "devmem": d.Devmem, "devcore": d.Devcore,
		"type": d.Type, "numa": d.Numa, "mode": d.Mode, "health": d.Health, "migProfiles": d.MIGProfiles,
	}
}

func devicesResult(list []*device.DeviceInfo, err error) obj {
	if err != nil {
		return obj{"ok": false, "error": err.Error()}
	}
	out := []obj{}
	for _, d := range list {
		if d == nil {
			return obj{"ok": true, "error": "nil device in list (a JSON null item)"}
		}
		out = append(out, deviceOut(d))
	}
	return obj{"ok": true, "devices": out}
}

func registerResult(value string) obj {
	list, err := device.UnMarshalNodeDevices(value)
	return devicesResult(list, err)
}

func getNodeDevices(cfg nvidia.NvidiaConfig, value string) (result obj) {
	node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "go-node", Annotations: map[string]string{
		nvidia.RegisterAnnos: value,
	}}}
	defer func() {
		if r := recover(); r != nil {
			result = obj{"ok": false, "error": "PANIC: " + fmt.Sprint(r)}
		}
	}()
	list, err := nvidia.InitNvidiaDevice(cfg).GetNodeDevices(node)
	return devicesResult(list, err)
}
