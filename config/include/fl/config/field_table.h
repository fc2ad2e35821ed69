// A struct's YAML fields declared once, as a table: each field's path in the YAML, the member it is stored
// in, its type and bounds, and the name it has in flat records. From the table come
//   - the strict reader (FieldTable::Read): the keys allowed in each map are the table's, so an unknown key
//     is an error that lists exactly what the reader reads;
//   - any writer or reader of a record of the struct (VisitRecorded): fl-experiment's resolved manifest JSON
//     is written and read back from the same table as the manifest's YAML.
// Adding a field is one line:
//
//   const config::FieldTable<Server> kServer = {
//       config::IntField("rounds", &Server::rounds, 1, 1'000'000).Required(),
//       config::NumberField("selection.fraction_fit", &Server::fraction_fit, {0, 1}),
//       config::IntField("evaluation.every", &Server::evaluate_every, 0, 1'000'000).Recorded("evaluate_every"),
//   };
//
// Dotted paths are nested maps ("selection:" above), checked like the table's own map.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/config/yaml_fields.h"

namespace fl::config {

// The member a field is stored in. std::monostate: the field is read and checked but kept nowhere (a label
// such as `description`, a key the loader accepts for compatibility, a field read by a custom reader).
template <typename T>
using Member =
    std::variant<std::monostate, std::string T::*, bool T::*, uint32_t T::*, uint64_t T::*, int64_t T::*, double T::*>;

enum class FieldKind { kString, kInteger, kNumber, kBool, kChoice, kCustom };

template <typename T>
struct Field {
  // Reads a kCustom field whose key is present in `map` (the map the key is in) into `out`.
  using ReadFn = std::function<absl::Status(const YamlMap& map, const std::string& key, T& out)>;
  // Runs after the field was read, whether it was present or not (but not when the nested map it is in is
  // absent): checks across fields, derived values. Fields are read in the order of the table.
  using CheckFn = std::function<absl::Status(const YamlMap& map, T& out)>;

  std::string yaml;  // path below the table's map: "rounds", "selection.fraction_fit"; "" = not in YAML
  std::string name;  // name in flat records; "" = not recorded. Defaults to the last part of `yaml`.
  Member<T> member;
  FieldKind kind = FieldKind::kString;
  NumberRange range;    // kNumber
  int64_t int_min = 0;  // kInteger
  int64_t int_max = 0;
  std::vector<std::string> choices;  // kChoice
  bool required = false;
  std::string allowed;  // what the field accepts, where the default description (from the kind) is not enough
  ReadFn read;          // kCustom
  CheckFn check;
  // false: records written before the field existed lack it, and reading one keeps the member's default.
  bool in_old_records = true;

  Field& Required() {
    required = true;
    return *this;
  }
  Field& Allowed(std::string text) {
    allowed = std::move(text);
    return *this;
  }
  Field& Then(CheckFn fn) {
    check = std::move(fn);
    return *this;
  }
  Field& Recorded(std::string record_name) {
    name = std::move(record_name);
    return *this;
  }
  Field& NotRecorded() {
    name.clear();
    return *this;
  }
  Field& NewInRecords() {
    in_old_records = false;
    return *this;
  }
};

namespace field_internal {

template <typename P>
struct MemberTypeOf;
template <typename C, typename M>
struct MemberTypeOf<M C::*> {
  using type = M;
};

inline std::string LastPart(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

template <typename T, typename P>
Field<T> Make(std::string yaml, P member, FieldKind kind) {
  Field<T> f;
  f.name = LastPart(yaml);
  f.yaml = std::move(yaml);
  f.kind = kind;
  if (member != nullptr) {
    f.member = member;
  } else {
    f.name.clear();
  }
  return f;
}

// Stores `value` in the field's member (nothing for std::monostate).
template <typename T, typename V>
void Store(const Member<T>& member, T& out, const V& value) {
  std::visit(
      [&](auto ptr) {
        using P = decltype(ptr);
        if constexpr (!std::is_same_v<P, std::monostate>) {
          using M = typename MemberTypeOf<P>::type;
          if constexpr (std::is_arithmetic_v<M> && std::is_arithmetic_v<V>) {
            out.*ptr = static_cast<M>(value);
          } else if constexpr (std::is_same_v<M, V>) {
            out.*ptr = value;
          }
        }
      },
      member);
}

}  // namespace field_internal

// Builders, one per kind. T is deduced from the member; a field kept nowhere names T: StringField<Config>("x").
template <typename T>
Field<T> StringField(std::string yaml, std::string T::*member = nullptr) {
  return field_internal::Make<T>(std::move(yaml), member, FieldKind::kString);
}

// An integer in [min, max] stored in any integer member (the bounds must fit it; the default is its range).
template <typename T, typename I>
Field<T> IntField(std::string yaml, I T::*member, int64_t min = 0,
                  int64_t max = static_cast<int64_t>(std::min<uint64_t>(std::numeric_limits<I>::max(),
                                                                        std::numeric_limits<int64_t>::max()))) {
  static_assert(std::is_integral_v<I> && !std::is_same_v<I, bool>);
  Field<T> f = field_internal::Make<T>(std::move(yaml), member, FieldKind::kInteger);
  f.int_min = min;
  f.int_max = max;
  return f;
}

template <typename T>
Field<T> NumberField(std::string yaml, double T::*member, NumberRange range) {
  Field<T> f = field_internal::Make<T>(std::move(yaml), member, FieldKind::kNumber);
  f.range = range;
  return f;
}

template <typename T>
Field<T> BoolField(std::string yaml, bool T::*member) {
  return field_internal::Make<T>(std::move(yaml), member, FieldKind::kBool);
}

template <typename T>
Field<T> ChoiceField(std::string yaml, std::string T::*member, std::vector<std::string> choices) {
  Field<T> f = field_internal::Make<T>(std::move(yaml), member, FieldKind::kChoice);
  f.choices = std::move(choices);
  return f;
}

// Read by `read` when present. `member` (optional) is where it ends up, for records.
template <typename T>
Field<T> CustomField(std::string yaml, typename Field<T>::ReadFn read, Member<T> member = {}) {
  Field<T> f;
  f.name = std::holds_alternative<std::monostate>(member) ? std::string() : field_internal::LastPart(yaml);
  f.yaml = std::move(yaml);
  f.kind = FieldKind::kCustom;
  f.read = std::move(read);
  f.member = member;
  return f;
}

// In records only (not in the YAML): a value the loader derives, such as where a profile came from.
template <typename T, typename M>
Field<T> RecordField(std::string name, M T::*member) {
  Field<T> f;
  f.name = std::move(name);
  f.member = member;
  return f;
}

template <typename T>
class FieldTable {
 public:
  FieldTable(std::initializer_list<Field<T>> fields) : fields_(fields) {}
  explicit FieldTable(std::vector<Field<T>> fields) : fields_(std::move(fields)) {}

  const std::vector<Field<T>>& fields() const { return fields_; }

  // The keys allowed in the map at `section` ("" = the table's own map, "selection" = its selection: map), in
  // the order of the table.
  std::vector<std::string> KeysAt(std::string_view section) const {
    std::vector<std::string> keys;
    for (const Field<T>& f : fields_) {
      std::string_view rest = f.yaml;
      if (rest.empty()) continue;
      if (!section.empty()) {
        if (!(rest.size() > section.size() && rest.starts_with(section) && rest[section.size()] == '.')) continue;
        rest.remove_prefix(section.size() + 1);
      }
      const std::string key(rest.substr(0, rest.find('.')));
      bool seen = false;
      for (const std::string& k : keys) seen = seen || k == key;
      if (!seen) keys.push_back(key);
    }
    return keys;
  }

  // "a map with keys a, b, c".
  std::string Describe(std::string_view section = {}) const {
    const std::vector<std::string> keys = KeysAt(section);
    return keys.empty() ? "an empty map {}" : "a map with keys " + JoinList(keys);
  }

  // Checks the keys of `map` and of its nested maps against the table, then reads every field in the order of
  // the table (a field's Then() check right after it). Absent fields keep what `out` holds.
  absl::Status Read(const YamlMap& map, T& out) const {
    if (absl::Status s = map.Check(KeysAt("")); !s.ok()) return s;
    std::map<std::string, std::optional<YamlMap>> sections;
    for (const Field<T>& f : fields_) {
      if (f.yaml.empty()) continue;
      const size_t dot = f.yaml.rfind('.');
      const YamlMap* parent = &map;
      if (dot != std::string::npos) {
        absl::StatusOr<const YamlMap*> p = Section(map, f.yaml.substr(0, dot), sections);
        if (!p.ok()) return p.status();
        parent = *p;
        if (parent == nullptr) continue;  // the whole section is absent: its fields keep their defaults
      }
      const std::string key = field_internal::LastPart(f.yaml);
      if (f.required) {
        if (absl::Status s = parent->Required(key, AllowedFor(f)); !s.ok()) return s;
      }
      if (absl::Status s = ReadOne(*parent, key, f, out); !s.ok()) return s;
      if (f.check) {
        if (absl::Status s = f.check(*parent, out); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

  // Calls fn(field, value) for every recorded field (a name and a member), value being the member of `v`.
  template <typename Obj, typename Fn>
  void VisitRecorded(Obj& v, Fn&& fn) const {
    static_assert(std::is_same_v<std::remove_const_t<Obj>, T>);
    for (const Field<T>& f : fields_) {
      if (f.name.empty()) continue;
      std::visit(
          [&](auto ptr) {
            if constexpr (!std::is_same_v<decltype(ptr), std::monostate>) fn(f, v.*ptr);
          },
          f.member);
    }
  }

 private:
  std::string AllowedFor(const Field<T>& f) const {
    if (!f.allowed.empty()) return f.allowed;
    switch (f.kind) {
      case FieldKind::kString: return "a string";
      case FieldKind::kInteger:
        return "an integer in [" + std::to_string(f.int_min) + ", " + std::to_string(f.int_max) + "]";
      case FieldKind::kBool: return "true, false";
      case FieldKind::kChoice: return JoinList(f.choices);
      default: return {};
    }
  }

  absl::Status ReadOne(const YamlMap& map, const std::string& key, const Field<T>& f, T& out) const {
    switch (f.kind) {
      case FieldKind::kString: return Keep(map.String(key, f.allowed), f, out);
      case FieldKind::kInteger: return Keep(map.Integer(key, f.int_min, f.int_max, f.allowed), f, out);
      case FieldKind::kNumber: return Keep(map.Number(key, f.range, f.allowed), f, out);
      case FieldKind::kBool: return Keep(map.Bool(key), f, out);
      case FieldKind::kChoice: return Keep(map.Choice(key, f.choices), f, out);
      case FieldKind::kCustom: return map.Has(key) ? f.read(map, key, out) : absl::OkStatus();
    }
    return absl::OkStatus();
  }

  template <typename V>
  static absl::Status Keep(absl::StatusOr<std::optional<V>> v, const Field<T>& f, T& out) {
    if (!v.ok()) return v.status();
    if (v->has_value()) field_internal::Store(f.member, out, **v);
    return absl::OkStatus();
  }

  // The nested map at `prefix` (nullptr when absent), its keys checked once.
  absl::StatusOr<const YamlMap*> Section(const YamlMap& root, const std::string& prefix,
                                         std::map<std::string, std::optional<YamlMap>>& cache) const {
    if (auto it = cache.find(prefix); it != cache.end()) return it->second.has_value() ? &*it->second : nullptr;
    const size_t dot = prefix.rfind('.');
    const YamlMap* parent = &root;
    if (dot != std::string::npos) {
      absl::StatusOr<const YamlMap*> p = Section(root, prefix.substr(0, dot), cache);
      if (!p.ok()) return p.status();
      parent = *p;
    }
    std::optional<YamlMap> section;
    if (parent != nullptr) {
      absl::StatusOr<std::optional<YamlMap>> m = parent->Map(field_internal::LastPart(prefix), Describe(prefix));
      if (!m.ok()) return m.status();
      section = *std::move(m);
      if (section.has_value()) {
        if (absl::Status s = section->Check(KeysAt(prefix)); !s.ok()) return s;
      }
    }
    auto [it, inserted] = cache.emplace(prefix, std::move(section));
    return it->second.has_value() ? &*it->second : nullptr;
  }

  std::vector<Field<T>> fields_;
};

// A nested map read by its own table into a member struct (`server:` into Manifest::server).
template <typename T, typename U>
Field<T> SectionField(std::string yaml, U T::*member, FieldTable<U> table) {
  auto shared = std::make_shared<const FieldTable<U>>(std::move(table));
  Field<T> f = CustomField<T>(std::move(yaml),
                              [member, shared](const YamlMap& map, const std::string& key, T& out) -> absl::Status {
                                absl::StatusOr<std::optional<YamlMap>> m = map.Map(key, shared->Describe());
                                if (!m.ok()) return m.status();
                                return shared->Read(**m, out.*member);
                              });
  f.allowed = shared->Describe();
  return f;
}

}  // namespace fl::config
